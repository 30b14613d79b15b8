/* dlinspect's copies of host tensors (src/put.pxi, _fill): one pass at memory speed, no GIL.
 * The source is a DLTensor's memory (strides in elements, any sign; TensorInfo validated every
 * address), its elements maybe misaligned: every scalar move is a memcpy, every vector one an
 * unaligned SSE2 move. A gather (dl_gather_part) makes the layout canonical, then copies each
 * transposed plane (x.T, NCHW -> NHWC) by SSE2 register transposes (dl_plane_copy), or else
 * each row (dl_row), an odometer walking the other axes. DL_COPY_NO_SIMD (or a target without
 * SSE2) compiles the plain C loops alone, which write the same bytes. */
#ifndef DLINSPECT_COPY_H_
#define DLINSPECT_COPY_H_

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif
#if !defined(DL_COPY_NO_SIMD) && (defined(__SSE2__) || defined(_M_X64) || \
                                  (defined(_M_IX86_FP) && _M_IX86_FP >= 2))
#include <emmintrin.h>
#define DL_COPY_SSE2 1
#else
#define DL_COPY_SSE2 0
#endif

#if defined(_MSC_VER)
#define DL_INLINE static __forceinline
#elif defined(__GNUC__) || defined(__clang__)
#define DL_INLINE static inline __attribute__((always_inline))
#else
#define DL_INLINE static inline
#endif

/* How each element is written: as it is, or narrowed as JAX narrows with x64 off. (C numbers
 * them 0, 1, 2, as dl_tile_simd_any counts on.) */
typedef enum {
  DL_COPY_SAME,      /* the bytes as they are */
  DL_COPY_F64_F32,   /* each 8-byte float rounded to float (complex: both parts) */
  DL_COPY_U64_U32,   /* each 8-byte integer's low 32 bits (wraps, as NumPy's cast) */
} dl_copy_cast;

/* contract: the bytes an element of `size` source bytes takes in the destination. */
DL_INLINE int64_t dl_out(size_t size, dl_copy_cast cast) {
  return (int64_t)(cast == DL_COPY_SAME ? size : size / 2);
}

/* Below this many destination bytes a second thread costs more than it saves (measured on
 * a 2-core x86-64 VM, both cores idle, with put.pxi's C worker: two halves take 1.1-2x the
 * time of one at 1 MiB and 0.9-1.15x at 2 MiB for dense rows; 0.5-0.65x from 4 MiB for
 * transposes and 0.9-0.95x at 4 MiB for memory-bound rows). */
#define DL_COPY_PARALLEL_MIN ((size_t)4 << 20)

/* From this many destination bytes a transposing or dense copy stores with streaming
 * (non-temporal) stores: the destination no longer fits the caches, and ordinary stores
 * would first read each line from memory (measured on a 2-core x86-64 VM, two threads,
 * memory touched before: dense copies of 4-256 MiB in 0.8-0.97x memcpy's time). */
#ifndef DL_COPY_STREAM_MIN
#define DL_COPY_STREAM_MIN ((size_t)4 << 20)
#endif

/* The destination bytes from which a copy of rows stores streaming: the last-level cache's
 * size where the system says it (dl_copy_init), at least DL_COPY_STREAM_MIN and at most
 * DL_COPY_CACHE_MAX. Ordinary stores write a destination the cache holds faster (measured
 * on a 2-core x86-64 VM with a 480 MiB L3, memory touched before: rows of 4 to 30 MiB took
 * 1.05-1.2x the time streaming). */
static size_t dl_rows_stream_min = DL_COPY_STREAM_MIN;

/* The most of a larger last-level cache a copy counts on: a large one is shared with other
 * cores (a virtual machine says its host's), and a destination it is said to hold is not
 * held (measured on that VM, JAX holding the last results as it does, process CPU time
 * against the fastest of jnp.asarray and NumPy's copy + import: dense 64 MiB 0.70x
 * streaming, 1.33x not; 32 MiB 0.94x and 0.95x; 256 MiB 1.08x and 0.98x, within the
 * baselines' spread). */
#define DL_COPY_CACHE_MAX ((size_t)32 << 20)

/* contract: sets dl_rows_stream_min from the last-level cache's size; called once, before
 * any copy (the copying threads only read it). */
static inline void dl_copy_init(void) {
#if defined(__linux__) && defined(_SC_LEVEL3_CACHE_SIZE)
  const long llc = sysconf(_SC_LEVEL3_CACHE_SIZE); /* (0 or -1: not said) */
  if (llc > (long)DL_COPY_STREAM_MIN) dl_rows_stream_min = (size_t)llc;
  if (dl_rows_stream_min > DL_COPY_CACHE_MAX) dl_rows_stream_min = DL_COPY_CACHE_MAX;
#endif
}

/* Into fresh pages (dl_fresh: each first touch has the kernel zero a page, which leaves its
 * lines cached) a band of destination up to DL_COPY_BAND_MAX wide, and a dense copy, store
 * ordinarily, into those lines; a wider band streams. */
#ifndef DL_COPY_BAND_MAX
#define DL_COPY_BAND_MAX ((size_t)2 << 20)
#endif

/* Panels: DL_PANEL_J source bytes along j (long runs for the hardware prefetchers) by
 * DL_PANEL_I destination bytes along i, in blocks of one cache line each way, so that a
 * destination line is written whole before the next (directly, or from a staging block in
 * L1 when streaming). */
#ifndef DL_PANEL_J
#define DL_PANEL_J 4096
#endif
#ifndef DL_PANEL_I
#define DL_PANEL_I 128
#endif

/* contract: ask the kernel for transparent huge pages over [p, p + n) when n is at least
 * 4 MiB (as NumPy's allocator does), so that the first touch of a large copy faults
 * 2 MiB at a time; a no-op elsewhere or where the kernel declines. (Measured with THP
 * "madvise": a fresh 64 MiB block fills in half the time with it. MADV_HUGEPAGE needs
 * _DEFAULT_SOURCE or GNU C: under a strict -std=c99 this compiles to the no-op.) */
static inline void dl_advise_huge(void* p, size_t n) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  const uintptr_t page = 4096;
  if (n >= ((size_t)4 << 20)) {
    uintptr_t start = ((uintptr_t)p + page - 1) & ~(page - 1);
    uintptr_t end = ((uintptr_t)p + n) & ~(page - 1); /* past start: n spans many pages */
    (void)madvise((void*)start, end - start, MADV_HUGEPAGE);
  }
#else
  (void)p;
  (void)n;
#endif
}

/* contract: whether the destination [p, p + n) is fresh pages: its middle page not yet in
 * memory (mincore), as a block malloc has just mapped (glibc does from 32 MiB); a block
 * memory backs (malloc's reused heap) is not; below DL_COPY_STREAM_MIN, where nothing
 * streams, 0 without a system call. Elsewhere than Linux: n is at least 32 MiB. */
static inline int dl_fresh(const void* p, size_t n) {
#if defined(__linux__)
  const uintptr_t page = 4096;
  unsigned char in_memory = 1;
  void* mid = (void*)(((uintptr_t)p + n / 2) & ~(page - 1));
  if (n < DL_COPY_STREAM_MIN || mincore(mid, page, &in_memory) != 0) return 0;
  return (in_memory & 1) == 0;
#else
  (void)p;
  return n >= ((size_t)32 << 20);
#endif
}

/* ---- One element ---------------------------------------------------------------- */

/* contract: writes the element at `src` to `dst` as `cast` says (narrowed: each 8 bytes to 4). */
static inline void dl_put1(char* dst, const char* src, size_t size, dl_copy_cast cast) {
  size_t p;
  if (cast == DL_COPY_SAME) {
    memcpy(dst, src, size);
  } else if (cast == DL_COPY_F64_F32) {
    for (p = 0; p < size / 8; p++) {
      double w;
      float f;
      memcpy(&w, src + 8 * p, 8);
      f = (float)w;
      memcpy(dst + 4 * p, &f, 4);
    }
  } else {
    for (p = 0; p < size / 8; p++) {
      uint64_t w;
      uint32_t u;
      memcpy(&w, src + 8 * p, 8);
      u = (uint32_t)w; /* the low 32 bits */
      memcpy(dst + 4 * p, &u, 4);
    }
  }
}

/* contract: copies `count` elements of `size` bytes as they are, the k-th from
 * src + k * sb to dst + k * size (common sizes compiled as constants). */
static inline void dl_gather_scalar(char* restrict dst, const char* restrict src,
                                    int64_t count, int64_t sb, size_t size) {
  int64_t k;
  switch (size) {
#define DL_SCALAR(N)                                        \
  case N:                                                   \
    for (k = 0; k < count; k++) {                           \
      memcpy(dst + k * N, src + k * sb, N);                 \
    }                                                       \
    break;
    DL_SCALAR(1) DL_SCALAR(2) DL_SCALAR(4) DL_SCALAR(8) DL_SCALAR(16)
    DL_SCALAR(3) DL_SCALAR(6) DL_SCALAR(12) DL_SCALAR(24) DL_SCALAR(32) /* pixels, pairs */
#undef DL_SCALAR
    default:
      for (k = 0; k < count; k++) {
        memcpy(dst + k * (int64_t)size, src + k * sb, size);
      }
  }
}

/* ---- Rows: the destination's innermost axis ------------------------------------- */

#if DL_COPY_SSE2
/* contract: the 16 bytes `v` with their `size`-byte elements (1, 2, 4 or 8) reversed. */
static inline __m128i dl_reverse16(__m128i v, size_t size) {
  if (size == 1) { /* swap the bytes of each 2-byte unit, then reverse those */
    v = _mm_or_si128(_mm_slli_epi16(v, 8), _mm_srli_epi16(v, 8));
  }
  if (size <= 2) { /* reverse the 2-byte units of each half, then swap the halves below */
    v = _mm_shufflelo_epi16(v, _MM_SHUFFLE(0, 1, 2, 3));
    v = _mm_shufflehi_epi16(v, _MM_SHUFFLE(0, 1, 2, 3));
  }
  if (size == 4) return _mm_shuffle_epi32(v, _MM_SHUFFLE(0, 1, 2, 3));
  return _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 0, 3, 2));
}

/* contract: the even-numbered `size`-byte elements (1, 2, 4 or 8) of the 32 bytes at `src`. */
static inline __m128i dl_evens32(const char* src, size_t size) {
  __m128i a = _mm_loadu_si128((const __m128i*)src),
          b = _mm_loadu_si128((const __m128i*)(src + 16));
  if (size == 1) { /* the low byte of each 2-byte unit; packus never saturates here */
    const __m128i m = _mm_set1_epi16(0xFF);
    return _mm_packus_epi16(_mm_and_si128(a, m), _mm_and_si128(b, m));
  }
  if (size == 2) { /* the low half of each 4-byte unit, sign-extended: packs is exact */
    a = _mm_srai_epi32(_mm_slli_epi32(a, 16), 16);
    b = _mm_srai_epi32(_mm_slli_epi32(b, 16), 16);
    return _mm_packs_epi32(a, b);
  }
  if (size == 4) {
    return _mm_castps_si128(
        _mm_shuffle_ps(_mm_castsi128_ps(a), _mm_castsi128_ps(b), _MM_SHUFFLE(2, 0, 2, 0)));
  }
  return _mm_unpacklo_epi64(a, b);
}

/* contract: 4 floats of the 4 doubles at `src` (F64_F32), or the low halves of 4 uint64s. */
static inline __m128i dl_narrow4(const char* src, dl_copy_cast cast) {
  if (cast == DL_COPY_F64_F32) { /* two floats from each 16 bytes, side by side */
    return _mm_castps_si128(_mm_movelh_ps(_mm_cvtpd_ps(_mm_loadu_pd((const double*)src)),
                                          _mm_cvtpd_ps(_mm_loadu_pd((const double*)(src + 16)))));
  }
  return dl_evens32(src, 4); /* the low 4 bytes of each 8: the even 4-byte units */
}

/* contract: the element at `src` (1, 2, 4, 8 or 16 bytes) repeated over 16 bytes. */
static inline __m128i dl_splat16(const char* src, size_t size) {
  uint64_t e = 0;
  size_t q;
  __m128i v;
  if (size == 16) return _mm_loadu_si128((const __m128i*)src);
  /* The element in e's low bytes (x86 is little-endian), then its q bytes of copies doubled
   * until they fill 8 bytes. */
  memcpy(&e, src, size);
  for (q = size; q < 8; q *= 2) e |= e << (8 * q);
  v = _mm_loadl_epi64((const __m128i*)&e);
  return _mm_unpacklo_epi64(v, v);
}

/* contract: dl_row's vector loops: copies the first elements of a broadcast, a reversed or
 * an every-other row of `size`-byte elements (1, 2, 4, 8 or 16); returns how many it wrote
 * (0 for any other row), the rest left to the scalar loop. */
static inline int64_t dl_row_simd(char* restrict dst, const char* restrict src, int64_t count,
                                  int64_t sb, size_t size) {
  const int64_t sz = (int64_t)size;
  int64_t k = 0, w, q;
  if (sz > 16 || (sz & (sz - 1)) != 0) return 0;
  w = 16 / sz; /* elements in 16 bytes */
  if (sb == 0) { /* broadcast: one 16-byte pattern stored over and over */
    const __m128i v = dl_splat16(src, size);
    for (; k + 4 * w <= count; k += 4 * w) { /* 64 bytes a step */
      for (q = 0; q < 64; q += 16) _mm_storeu_si128((__m128i*)(dst + k * sz + q), v);
    }
    for (; k + w <= count; k += w) _mm_storeu_si128((__m128i*)(dst + k * sz), v);
  } else if (sb == -sz && sz < 16) { /* reversed: k .. k + w - 1 lie at src - (k + w - 1) * sz */
    for (; k + w <= count; k += w) {
      __m128i v = _mm_loadu_si128((const __m128i*)(src - (k + w - 1) * sz));
      _mm_storeu_si128((__m128i*)(dst + k * sz), dl_reverse16(v, size));
    }
  } else if (sb == 2 * sz && sz < 16) { /* every other element: the 32 bytes loaded end at
                                           element k + w, so it must exist */
    for (; k + w < count; k += w) {
      _mm_storeu_si128((__m128i*)(dst + k * sz), dl_evens32(src + k * sb, size));
    }
  }
  return k;
}
#endif

/* contract: dl_row narrowed: each 8-byte part of each element to 4 bytes (a dense row four
 * parts a vector step). `nt`: a dense row to a 16-byte aligned `dst` stores with streaming
 * stores (the caller fences). */
static inline void dl_row_narrow(char* restrict dst, const char* restrict src, int64_t count,
                                  int64_t sb, size_t size, dl_copy_cast cast, int nt) {
  const int64_t parts = (int64_t)size / 8;
  int64_t k = 0;
  if (sb == (int64_t)size) { /* dense: one loop over the parts */
    const int64_t total = count * parts;
#if DL_COPY_SSE2
    nt = nt && !((uintptr_t)dst & 15);
    for (; k + 4 <= total; k += 4) { /* (GCC -O3 makes a loop of each store) */
      const __m128i v = dl_narrow4(src + 8 * k, cast);
      if (nt) {
        _mm_stream_si128((__m128i*)(dst + 4 * k), v);
      } else {
        _mm_storeu_si128((__m128i*)(dst + 4 * k), v);
      }
    }
#else
    (void)nt;
#endif
    for (; k < total; k++) dl_put1(dst + 4 * k, src + 8 * k, 8, cast);
    return;
  }
  for (; k < count; k++) dl_put1(dst + 4 * parts * k, src + k * sb, size, cast);
}

/* contract: dl_row's dense run: copies the `n` bytes at `src` to `dst`. `nt`: with
 * streaming stores (the caller fences). */
static inline void dl_row_dense(char* restrict dst, const char* restrict src, size_t n,
                                 int nt) {
  size_t i = 0;
#if DL_COPY_SSE2
  if (nt) { /* to a 16-byte boundary, then 64 bytes a step: four loads, four stores */
    i = (16 - ((uintptr_t)dst & 15)) & 15;
    memcpy(dst, src, i < n ? i : n);
    for (; i + 64 <= n; i += 64) {
      __m128i v[4];
      int m;
      for (m = 0; m < 4; m++) v[m] = _mm_loadu_si128((const __m128i*)(src + i) + m);
      for (m = 0; m < 4; m++) _mm_stream_si128((__m128i*)(dst + i) + m, v[m]);
    }
  }
#else
  (void)nt;
#endif
  if (i < n) memcpy(dst + i, src + i, n - i);
}

/* contract: writes `count` elements of `size` bytes, the k-th from src + k * sb, to `dst`
 * packed, as `cast` says. dst and src do not overlap. `nt`: a dense run stores with
 * streaming stores (the caller fences). */
static inline void dl_row(char* restrict dst, const char* restrict src, int64_t count,
                          int64_t sb, size_t size, dl_copy_cast cast, int nt) {
  const int64_t sz = (int64_t)size;
  int64_t k = 0;
  if (cast != DL_COPY_SAME) {
    dl_row_narrow(dst, src, count, sb, size, cast, nt);
    return;
  }
  if (sb == sz) {
    dl_row_dense(dst, src, (size_t)count * size, nt);
    return;
  }
#if DL_COPY_SSE2
  k = dl_row_simd(dst, src, count, sb, size);
#endif
  if (sb == 0 && size == 1) {
    memset(dst + k, (unsigned char)src[0], (size_t)(count - k));
  } else {
    dl_gather_scalar(dst + k * sz, src + k * sb, count - k, sb, size);
  }
}

/* ---- Tiles: a transposed plane -------------------------------------------------- */

#if DL_COPY_SSE2
/* contract: the units of `e` bytes (1, 2, 4 or 8) of a and b interleaved, from their low
 * halves (hi = 0) or their high halves. */
DL_INLINE __m128i dl_zip(__m128i a, __m128i b, int64_t e, int hi) {
  switch (e) {
    case 1:
      return hi ? _mm_unpackhi_epi8(a, b) : _mm_unpacklo_epi8(a, b);
    case 2:
      return hi ? _mm_unpackhi_epi16(a, b) : _mm_unpacklo_epi16(a, b);
    case 4:
      return hi ? _mm_unpackhi_epi32(a, b) : _mm_unpacklo_epi32(a, b);
    default:
      return hi ? _mm_unpackhi_epi64(a, b) : _mm_unpacklo_epi64(a, b);
  }
}

/* contract: one microtile of w x w elements (w = 16 / size, or 32 / size narrowed):
 * dst + m * dj + k * out gets the element at src + k * si + m * size, as cast says, for
 * k, m < w: w loads of 16 source bytes (32 narrowed), a register transpose, w unaligned
 * stores of 16 bytes. The transpose: row k of r holds elements (k, 0 .. w); each
 * stage replaces r by LO(r_0, r_w/2), HI(r_0, r_w/2), LO(r_1, r_w/2+1), ..., which rotates
 * the (row, column) index bits by one, so log2(w) stages leave column m in r_m. */
DL_INLINE void dl_micro(char* dst, int64_t dj, const char* src, int64_t si, size_t size,
                        dl_copy_cast cast) {
  const int64_t e = dl_out(size, cast), w = 16 / e; /* e: the bytes of a unit zipped */
  __m128i r[16], t[16];
  int64_t k, s;
#pragma GCC unroll 16
  for (k = 0; k < w; k++) {
    r[k] = cast == DL_COPY_SAME ? _mm_loadu_si128((const __m128i*)(src + k * si))
                                : dl_narrow4(src + k * si, cast);
  }
#pragma GCC unroll 4
  for (s = 1; s < w; s *= 2) {
#pragma GCC unroll 8
    for (k = 0; k < w / 2; k++) {
      t[2 * k] = dl_zip(r[k], r[k + w / 2], e, 0);
      t[2 * k + 1] = dl_zip(r[k], r[k + w / 2], e, 1);
    }
#pragma GCC unroll 16
    for (k = 0; k < w; k++) r[k] = t[k];
  }
#pragma GCC unroll 16
  for (k = 0; k < w; k++) _mm_storeu_si128((__m128i*)(dst + k * dj), r[k]);
}

/* contract: one block of a plane as dl_tile_simd says, nj x ni elements (multiples of w;
 * a cache line of source along j, of destination along i): microtiles straight into dst,
 * or where `nt` into a staging block first, then streamed a destination line at a time. */
DL_INLINE void dl_tile_block(char* dst, const char* src, int64_t nj, int64_t ni, int64_t si,
                             int64_t dj, size_t size, dl_copy_cast cast, int nt) {
  const int64_t sz = (int64_t)size, out = dl_out(size, cast), w = 16 / out;
  __m128i stage[256]; /* the block's destination: nj <= 64 rows of 64 bytes */
  char* b = (char*)stage;
  int64_t j, i, c;
  if (!nt) {
    for (j = 0; j < nj; j += w) {
      for (i = 0; i < ni; i += w) {
        dl_micro(dst + j * dj + i * out, dj, src + j * sz + i * si, si, size, cast);
      }
    }
    return;
  }
  /* Transposed into `stage` (rows 64 bytes apart), then streamed a destination line at a
   * time: few write-combining buffers in use. */
  for (i = 0; i < ni; i += w) { /* each source line consumed before the next */
    for (j = 0; j < nj; j += w) {
      dl_micro(b + j * 64 + i * out, 64, src + j * sz + i * si, si, size, cast);
    }
  }
  for (j = 0; j < nj; j++) {
    for (c = 0; c < ni * out; c += 16) { /* a row: a multiple of 16 bytes */
      _mm_stream_si128((__m128i*)(dst + j * dj + c),
                       _mm_load_si128((const __m128i*)(b + j * 64 + c)));
    }
  }
}

/* contract: the nj x ni elements (both multiples of w) of a plane as dl_plane_copy says,
 * with a source dense along j (sj = size), by microtiles, panel by panel, block by block. */
DL_INLINE void dl_tile_simd(char* dst, const char* src, int64_t nj, int64_t ni, int64_t si,
                            int64_t dj, size_t size, dl_copy_cast cast, int nt) {
  const int64_t sz = (int64_t)size, out = dl_out(size, cast), w = 16 / out;
  const int64_t pj = DL_PANEL_J / sz, pi = DL_PANEL_I / out > w ? DL_PANEL_I / out : w;
  const int64_t bj = 64 / sz, bi = 64 / out; /* 2 or 4 microtiles (w <= 32 / sz, 16 / out) */
  int64_t j0, i0, j1, i1;
  for (j0 = 0; j0 < nj; j0 += pj) {
    const int64_t ej0 = nj - j0 < pj ? nj : j0 + pj;
    for (i0 = 0; i0 < ni; i0 += pi) {
      const int64_t ei0 = ni - i0 < pi ? ni : i0 + pi;
      for (j1 = j0; j1 < ej0; j1 += bj) {
        const int64_t ej1 = ej0 - j1 < bj ? ej0 : j1 + bj;
        for (i1 = i0; i1 < ei0; i1 += bi) {
          const int64_t ei1 = ei0 - i1 < bi ? ei0 : i1 + bi;
          dl_tile_block(dst + j1 * dj + i1 * out, src + j1 * sz + i1 * si, ej1 - j1, ei1 - i1,
                        si, dj, size, cast, nt);
        }
      }
    }
  }
}

/* contract: dl_tile_simd compiled with each size and cast as constants (so that the
 * microtile's vectors stay in registers). */
static void dl_tile_simd_any(char* dst, const char* src, int64_t nj, int64_t ni, int64_t si,
                             int64_t dj, size_t size, dl_copy_cast cast, int nt) {
  /* narrowed: 8 or 16 bytes (a double, a complex128), cast 1 or 2; the bytes as they are
   * (cast 0): 1, 2, 4, 8 or 16. So size + cast tells them apart. */
  switch (size + cast) {
#define DL_TILE(S, C)                                              \
  case (S) + (C):                                                  \
    dl_tile_simd(dst, src, nj, ni, si, dj, S, C, nt);              \
    break;
    DL_TILE(1, DL_COPY_SAME) DL_TILE(2, DL_COPY_SAME) DL_TILE(4, DL_COPY_SAME)
    DL_TILE(8, DL_COPY_SAME) DL_TILE(8, DL_COPY_F64_F32) DL_TILE(8, DL_COPY_U64_U32)
    DL_TILE(16, DL_COPY_F64_F32) DL_TILE(16, DL_COPY_U64_U32)
#undef DL_TILE
    default:
      dl_tile_simd(dst, src, nj, ni, si, dj, 16, DL_COPY_SAME, nt);
  }
}
#endif

/* contract: the nj x ni block, dst + j * dj + i * out getting the element at
 * src + j * sj + i * si as cast says, one element at a time, in blocks of 16 x 16 elements
 * (a block's source lines stay in L1). */
static inline void dl_tile_scalar(char* dst, const char* src, int64_t nj, int64_t ni,
                                  int64_t sj, int64_t si, int64_t dj, size_t size,
                                  dl_copy_cast cast) {
  const int64_t out = dl_out(size, cast);
  int64_t j0, i0, j, i;
  for (j0 = 0; j0 < nj; j0 += 16) {
    const int64_t ej = nj - j0 < 16 ? nj : j0 + 16;
    for (i0 = 0; i0 < ni; i0 += 16) {
      const int64_t ci = ni - i0 < 16 ? ni - i0 : 16;
      for (j = j0; j < ej; j++) {
        char* d = dst + j * dj + i0 * out;
        const char* s = src + j * sj + i0 * si;
        if (cast == DL_COPY_SAME) {
          dl_gather_scalar(d, s, ci, si, size);
        } else {
          for (i = 0; i < ci; i++) dl_put1(d + i * out, s + i * si, size, cast);
        }
      }
    }
  }
}

/* contract: copies a transposed plane: dst + j * dj + i * out gets the element at
 * src + j * sj + i * si (as cast says; out = size, or size / 2 narrowed) for j < nj, i < ni,
 * i the destination's innermost axis and 0 < sj < |si|. Where j is dense (sj = size),
 * microtiles cover the first wj x wi elements (storing streaming where `stream` and the
 * destination's rows are 16-byte aligned); the rest goes one element at a time. */
DL_INLINE void dl_plane_copy(char* dst, const char* src, int64_t nj, int64_t ni, int64_t sj,
                             int64_t si, int64_t dj, size_t size, dl_copy_cast cast,
                             int stream) {
  const int64_t out = dl_out(size, cast);
  int64_t wj = 0, wi = 0;
#if DL_COPY_SSE2
  if (sj == (int64_t)size && (cast != DL_COPY_SAME || (size <= 16 && (size & (size - 1)) == 0))) {
    const int64_t w = 16 / out;
    wj = nj - nj % w;
    wi = ni - ni % w; /* (0 by 0 or 0 by any: the tiles' loops do not start) */
    dl_tile_simd_any(dst, src, wj, wi, si, dj, size, cast,
                     stream && (((uintptr_t)dst | (uintptr_t)dj) & 15) == 0);
  }
#else
  (void)stream;
#endif
  if (wi < ni) {
    dl_tile_scalar(dst + wi * out, src + wi * si, wj, ni - wi, sj, si, dj, size, cast);
  }
  if (wj < nj) {
    dl_tile_scalar(dst + wj * dj, src + wj * sj, nj - wj, ni, sj, si, dj, size, cast);
  }
}

/* ---- Layout and driver ---------------------------------------------------------- */

/* A tensor's layout in canonical form: n axes in destination (row-major) order, none of
 * extent 1, no two mergeable; strides in bytes. */
typedef struct {
  int n;
  size_t size;            /* source element bytes (a folded run counts as one element) */
  int64_t ext[64];        /* extents */
  int64_t sstr[64];       /* source strides, bytes */
  int64_t dstr[64];       /* destination strides, bytes (row-major) */
} dl_layout;

/* contract: fills `L` with the canonical layout of the tensor (strides in elements of
 * `src_size` bytes, ndim <= 64) copied as `cast` says; 0 for an empty tensor, else 1. */
static inline int dl_layout_make(dl_layout* L, int ndim, const int64_t* shape,
                                 const int64_t* strides, size_t src_size, dl_copy_cast cast) {
  int64_t step;
  int n = 0, d;
  for (d = 0; d < ndim; d++) {
    if (shape[d] == 0) return 0; /* (what L holds then is never read) */
    if (shape[d] == 1) continue; /* its stride never moves the pointer */
    /* Merge with the axis before when together they are one run of the inner stride. */
    if (n > 0 && L->sstr[n - 1] == strides[d] * shape[d]) {
      L->ext[n - 1] *= shape[d];
      L->sstr[n - 1] = strides[d];
      continue;
    }
    L->ext[n] = shape[d];
    L->sstr[n] = strides[d];
    n++;
  }
  L->size = src_size;
  /* A dense innermost run of up to 32 bytes (a pixel's channels, a complex pair) is one
   * wider element: the same bytes, moved whole. */
  if (cast == DL_COPY_SAME && n > 0 && L->sstr[n - 1] == 1) {
    const int64_t run = L->ext[n - 1] * (int64_t)src_size;
    if (run <= 32) {
      L->size = (size_t)run;
      n--;
    }
  }
  L->n = n;
  step = dl_out(L->size, cast); /* the destination's stride of axis d, row-major */
  for (d = n - 1; d >= 0; d--) {
    L->sstr[d] *= (int64_t)src_size; /* in bytes from here */
    L->dstr[d] = step;
    step *= L->ext[d];
  }
  return 1;
}

/* contract: the axis j of L whose planes (j by the innermost axis) are copied as transposes,
 * or -1 (rows): j strides narrower than any other axis that is not a broadcast, and than
 * the innermost axis, which strides wider than two elements (the rows of a stride of one or
 * two elements have vector loops of their own). */
static inline int dl_plane_axis(const dl_layout* L) {
  int64_t best = llabs(L->sstr[L->n - 1]); /* the innermost axis's stride, either sign */
  int tj = -1, d;
  if (best <= 2 * (int64_t)L->size) return -1; /* a broadcast row, or a nearly dense one */
  for (d = 0; d < L->n - 1; d++) {
    const int64_t s = llabs(L->sstr[d]);
    if (s != 0 && s < best) {
      best = s;
      tj = d;
    }
  }
  return tj;
}

/* contract: whether the copy of L (planes along tj, or rows where tj < 0) stores streaming:
 * a large transpose, decided on the whole copy, not the part, but into fresh pages only a
 * wide band; dense rows (narrowed too: float64 to float32 of 64 and 256 MiB in 0.82x the
 * time of ordinary stores, the lines they write no longer read first) into memory touched
 * before, larger than dl_rows_stream_min, each row starting a cache line (a line written
 * partly streaming and partly not is slow: rows of 4,148 bytes took 4x the time). */
static inline int dl_streams(const dl_layout* L, int tj, int fresh) {
  const int64_t total = L->dstr[0] * L->ext[0];
  if (total < (int64_t)DL_COPY_STREAM_MIN) return 0;
  if (tj >= 0) { /* a band: the rows of j one panel spans (dstr still row-major) */
    const int64_t panel = (int64_t)(DL_PANEL_J / L->size);
    const int64_t band = (panel < L->ext[tj] ? panel : L->ext[tj]) * L->dstr[tj];
    return !fresh || band > (int64_t)DL_COPY_BAND_MAX;
  }
  return !fresh && L->sstr[L->n - 1] == (int64_t)L->size &&
         total >= (int64_t)dl_rows_stream_min && (L->n == 1 || L->dstr[L->n - 2] % 64 == 0);
}

/* contract: whether a copy of the tensor (dl_gather_part's arguments) is worth a second
 * thread: transposed planes, whose register shuffles leave the memory time to spare. Rows
 * copy at memory speed on one thread: two add CPU time, not speed (measured: dense,
 * broadcast and reversed rows of 4 MiB in 1.1-1.35x one thread's process CPU time). */
static inline int dl_worth_two(int ndim, const int64_t* shape, const int64_t* strides,
                               size_t src_size, dl_copy_cast cast) {
  dl_layout L;
  return dl_layout_make(&L, ndim, shape, strides, src_size, cast) && L.n > 0 &&
         dl_plane_axis(&L) >= 0;
}

/* contract: whether axis d of L cuts into `nparts` near-equal slices: nparts divides its
 * extent (evenly), or it has 8 * nparts at least (finely). */
static inline int dl_cuts_well(const dl_layout* L, int d, int nparts) {
  return L->ext[d] >= 8 * (int64_t)nparts || L->ext[d] % nparts == 0;
}

/* contract: the axis of L that parts cut: the first that cuts well, taking first the axes
 * the odometer walks (each part then copies whole planes or rows), then the plane's j
 * (tj), then the row's; where none does, the longest. */
static inline int dl_cut_axis(const dl_layout* L, int tj, int nparts) {
  int a = 0, d;
  for (d = 0; d < L->n - 1; d++) {
    if (d != tj && dl_cuts_well(L, d, nparts)) return d;
  }
  if (tj >= 0 && dl_cuts_well(L, tj, nparts)) return tj;
  if (dl_cuts_well(L, L->n - 1, nparts)) return L->n - 1;
  for (d = 1; d < L->n; d++) {
    if (L->ext[d] > L->ext[a]) a = d;
  }
  return a;
}

/* contract: copies the `ndim`-d tensor at `src` (strides in elements of `src_size` bytes;
 * ndim <= 64, TensorInfo's bound) into `dst` in row-major order, each element as `cast`
 * says: this call part `part` of `nparts`, the destination cut along one canonical axis
 * into near-equal slices that write disjoint bytes and read only the source, so threads
 * may run them at once. `fresh`: the destination is fresh pages (dl_fresh of it all). */
static inline void dl_gather_part(char* restrict dst, const char* restrict src, int ndim,
                                  const int64_t* shape, const int64_t* strides,
                                  size_t src_size, dl_copy_cast cast, int fresh, int part,
                                  int nparts) {
  dl_layout L;
  int64_t idx[64] = {0}; /* the odometer: a position on each axis but the innermost */
  int64_t so = 0, doff = 0, nj = 1; /* bytes from src, dst to this position: inside both */
  int tj, stream, d;
  if (!dl_layout_make(&L, ndim, shape, strides, src_size, cast)) return;
  if (L.n == 0) { /* one element */
    if (part == 0) dl_put1(dst, src, L.size, cast);
    return;
  }
  tj = dl_plane_axis(&L);
  stream = dl_streams(&L, tj, fresh);
  if (nparts > 1) { /* keep this part's slice of one axis */
    const int a = dl_cut_axis(&L, tj, nparts);
    const int64_t lo = L.ext[a] * part / nparts;
    const int64_t hi = L.ext[a] * (part + 1) / nparts;
    if (hi <= lo) return;
    src += lo * L.sstr[a];
    dst += lo * L.dstr[a];
    L.ext[a] = hi - lo;
  }
  if (tj >= 0) { /* the planes' j: walked upwards in the source (the destination's rows go
                   down), and its extent 1 for the odometer, which then passes over it */
    if (L.sstr[tj] < 0) {
      src += (L.ext[tj] - 1) * L.sstr[tj];
      dst += (L.ext[tj] - 1) * L.dstr[tj];
      L.sstr[tj] = -L.sstr[tj];
      L.dstr[tj] = -L.dstr[tj];
    }
    nj = L.ext[tj];
    L.ext[tj] = 1;
  }
  /* The walk stays in this function: as a helper of its own (inlined or not), GCC 12 -O3
   * built the row and tile loops it calls worse, up to 1.4x the time of short rows and of
   * DL_COPY_NO_SIMD transposes (tests/c/compare.sh). */
  for (;;) {
    if (tj >= 0) {
      dl_plane_copy(dst + doff, src + so, nj, L.ext[L.n - 1], L.sstr[tj], L.sstr[L.n - 1],
                    L.dstr[tj], L.size, cast, stream);
    } else {
      dl_row(dst + doff, src + so, L.ext[L.n - 1], L.sstr[L.n - 1], L.size, cast, stream);
    }
    /* Next position: the odometer over the other axes. */
    for (d = L.n - 2; d >= 0; d--) {
      if (++idx[d] < L.ext[d]) {
        so += L.sstr[d];
        doff += L.dstr[d];
        break;
      }
      so -= (L.ext[d] - 1) * L.sstr[d];
      doff -= (L.ext[d] - 1) * L.dstr[d];
      idx[d] = 0;
    }
    if (d < 0) break;
  }
#if DL_COPY_SSE2
  if (stream) _mm_sfence(); /* the streaming stores, ordered before what follows */
#endif
}

#endif /* DLINSPECT_COPY_H_ */
