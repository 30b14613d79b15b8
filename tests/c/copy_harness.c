/* The copy kernel of include/dlinspect/copy.h against a plain reference gather, byte for
 * byte: thousands of generated views (any extents, steps of either sign, broadcast axes,
 * transposes, gaps, misaligned starts; elements of 1 to 32 bytes, narrowed or not), each
 * copied whole and in 2 and 3 parts, `fresh` or not, to a destination 16-byte aligned and
 * not; then large views (4 MiB and more) that stream and cut into parts at the header's
 * thresholds. The guard bytes around each destination must stay as they were.
 *
 *   cc -O3 -I include tests/c/copy_harness.c -o copy_harness && ./copy_harness
 *
 * tests/test_copy_kernel.py builds it with and without DL_COPY_NO_SIMD, at the header's
 * thresholds and at small ones (-DDL_COPY_STREAM_MIN=4096 ...) that take small copies
 * through the streaming and panel paths. Prints one line per group; exit status 1 at the
 * first difference (printed), 0 when every byte matched.
 *
 * A second kernel (tests/c/compare.sh): built with -DDL_BASELINE_HEADER='"base.h"', a copy
 * of copy.h from another revision whose names start with base_dl_ and BASE_DL_, its bytes
 * are compared too, and `./copy_harness --bench` times both on representative copies. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dlinspect/copy.h"

#ifdef DL_BASELINE_HEADER
#if defined(DL_COPY_NO_SIMD)
#define BASE_DL_COPY_NO_SIMD 1
#endif
#define BASE_DL_COPY_STREAM_MIN DL_COPY_STREAM_MIN
#define BASE_DL_COPY_BAND_MAX DL_COPY_BAND_MAX
#define BASE_DL_PANEL_J DL_PANEL_J
#define BASE_DL_PANEL_I DL_PANEL_I
#include DL_BASELINE_HEADER
#endif

#define GUARD 64 /* bytes before and after each destination */
#define MAX_NDIM 6

typedef struct {
  int ndim;
  int64_t shape[MAX_NDIM];
  int64_t strides[MAX_NDIM]; /* elements */
  size_t size;               /* source element bytes */
  dl_copy_cast cast;
  const char* src;           /* the first element */
} view;

/* ---- The kernels, called as the extension calls them ------------------------------ */

/* src/put.pxi calls the kernel from two places, the caller's thread (any part) and the
 * worker thread (part 0 of 2); so does this harness, each call site a function of its own,
 * so that the kernel checked and timed is a function called from two places, as there,
 * not one specialised for a case's constants. */
static __attribute__((noinline)) void kernel_call(char* dst, const view* v, int fresh,
                                                  int part, int nparts) {
  dl_gather_part(dst, v->src, v->ndim, v->shape, v->strides, v->size, v->cast, fresh, part,
                 nparts);
}

static __attribute__((noinline)) void kernel_worker(char* dst, const view* v, int fresh) {
  dl_gather_part(dst, v->src, v->ndim, v->shape, v->strides, v->size, v->cast, fresh, 0, 2);
}

#ifdef DL_BASELINE_HEADER
static __attribute__((noinline)) void base_call(char* dst, const view* v, int fresh, int part,
                                                int nparts) {
  base_dl_gather_part(dst, v->src, v->ndim, v->shape, v->strides, v->size,
                      (base_dl_copy_cast)v->cast, fresh, part, nparts);
}

static __attribute__((noinline)) void base_worker(char* dst, const view* v, int fresh) {
  base_dl_gather_part(dst, v->src, v->ndim, v->shape, v->strides, v->size,
                      (base_dl_copy_cast)v->cast, fresh, 0, 2);
}
#endif

/* Copies `v` into `dst` in `nparts` parts, one after another: by the baseline (`base`) or
 * the kernel; part 0 of 2 from the worker's call site. */
static void copy_parts(int base, char* dst, const view* v, int fresh, int nparts) {
  int part;
  for (part = 0; part < nparts; part++) {
    const int worker = part == 0 && nparts == 2;
#ifdef DL_BASELINE_HEADER
    if (base && worker) {
      base_worker(dst, v, fresh);
      continue;
    }
    if (base) {
      base_call(dst, v, fresh, part, nparts);
      continue;
    }
#else
    (void)base;
#endif
    if (worker) {
      kernel_worker(dst, v, fresh);
    } else {
      kernel_call(dst, v, fresh, part, nparts);
    }
  }
}

/* ---- Random numbers: splitmix64, the same cases on every machine ----------------- */

static uint64_t rng_state = 0x5eed;

static uint64_t rng(void) {
  uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static int64_t pick(int64_t lo, int64_t hi) { /* lo .. hi, both included */
  return lo + (int64_t)(rng() % (uint64_t)(hi - lo + 1));
}

static void fill_random(char* p, size_t n) {
  size_t i;
  for (i = 0; i + 8 <= n; i += 8) {
    const uint64_t r = rng();
    memcpy(p + i, &r, 8);
  }
  for (; i < n; i++) p[i] = (char)(rng() >> 56);
}

/* ---- The reference: one element at a time, in row-major order --------------------- */

static size_t out_size(size_t size, dl_copy_cast cast) {
  if (cast == DL_COPY_SAME) return size;
  return size / 2;
}

/* Writes the element at src to dst: its bytes, or each 8-byte part narrowed to 4 bytes (a
 * double rounded to float; an integer's low 32 bits). */
static void ref_put(char* dst, const char* src, size_t size, dl_copy_cast cast) {
  size_t p;
  if (cast == DL_COPY_SAME) {
    memcpy(dst, src, size);
    return;
  }
  for (p = 0; p < size; p += 8) {
    if (cast == DL_COPY_F64_F32) {
      double x;
      float f;
      memcpy(&x, src + p, 8);
      f = (float)x;
      memcpy(dst + p / 2, &f, 4);
    } else {
      uint64_t x;
      uint32_t low;
      memcpy(&x, src + p, 8);
      low = (uint32_t)(x & 0xFFFFFFFFu);
      memcpy(dst + p / 2, &low, 4);
    }
  }
}

static int64_t elements(const view* v) {
  int64_t n = 1;
  int d;
  for (d = 0; d < v->ndim; d++) n *= v->shape[d];
  return n;
}

static void ref_gather(char* dst, const view* v) {
  const size_t out = out_size(v->size, v->cast);
  const int64_t count = elements(v);
  int64_t idx[MAX_NDIM] = {0};
  int64_t e, off;
  int d;
  for (e = 0; e < count; e++) {
    off = 0;
    for (d = 0; d < v->ndim; d++) off += idx[d] * v->strides[d];
    ref_put(dst + e * (int64_t)out, v->src + off * (int64_t)v->size, v->size, v->cast);
    for (d = v->ndim - 1; d >= 0; d--) {
      if (++idx[d] < v->shape[d]) break;
      idx[d] = 0;
    }
  }
}

/* ---- Views ------------------------------------------------------------------------- */

static size_t pick_size(dl_copy_cast* cast) {
  static const size_t sizes[] = {1, 2, 4, 8, 16, 1, 2, 4, 8, 16, 3, 6, 12, 24, 32};
  size_t size = sizes[pick(0, sizeof sizes / sizeof sizes[0] - 1)];
  *cast = DL_COPY_SAME;
  if ((size == 8 || size == 16) && pick(0, 2) == 0) {
    *cast = pick(0, 1) ? DL_COPY_F64_F32 : DL_COPY_U64_U32;
  }
  return size;
}

/* Extents of a random view: mostly small, some long (the microtiles need 16 and more),
 * now and then empty; at most `budget` elements in all. */
static void pick_shape(view* v, int64_t budget) {
  int64_t so_far = 1;
  int d;
  for (d = 0; d < v->ndim; d++) {
    int64_t e = pick(0, 3) == 0 ? pick(8, 70) : pick(1, 6);
    if (pick(0, 200) == 0) e = 0;
    while (e > 1 && so_far * e > budget) e /= 2;
    v->shape[d] = e;
    so_far *= e > 0 ? e : 1;
  }
}

/* Strides of a view of a row-major block laid out in a random axis order, each axis
 * stepping 1, 2, 3, -1 or -2 of the block's elements, or broadcast (stride 0), the block
 * maybe wider than the view (gaps) but at most 16 times its size; or, now and then,
 * strides drawn at random (overlaps included: the source is only read). */
static void pick_strides(view* v) {
  const int64_t most = 16 * elements(v) + 64;
  int order[MAX_NDIM];
  int64_t stride = 1;
  int d, k;
  if (pick(0, 9) == 0) {
    for (d = 0; d < v->ndim; d++) v->strides[d] = pick(-40, 40);
    return;
  }
  for (d = 0; d < v->ndim; d++) order[d] = d;
  for (d = v->ndim - 1; d > 0; d--) { /* shuffled when drawn: a transpose */
    if (pick(0, 1)) {
      int t = order[d];
      k = (int)pick(0, d);
      order[d] = order[k];
      order[k] = t;
    }
  }
  for (k = v->ndim - 1; k >= 0; k--) {
    static const int64_t steps[] = {1, 1, 1, 1, 2, 3, -1, -2, 0};
    int64_t step = steps[pick(0, sizeof steps / sizeof steps[0] - 1)];
    int64_t pad = pick(0, 3) == 0 ? pick(1, 3) : 0;
    d = order[k];
    if (stride * (v->shape[d] * 3 + 3) > most) { /* the block as wide as it may grow */
      if (step > 1) step = 1;
      if (step < -1) step = -1;
      pad = 0;
    }
    v->strides[d] = stride * step;
    stride *= v->shape[d] * (step == 0 ? 1 : llabs(step)) + pad;
  }
}

/* The source's lowest and highest element offsets from the first element. */
static void reach(const view* v, int64_t* lo, int64_t* hi) {
  int d;
  *lo = 0;
  *hi = 0;
  for (d = 0; d < v->ndim; d++) {
    const int64_t r = (v->shape[d] - 1) * v->strides[d];
    if (v->shape[d] == 0) continue;
    if (r < 0) *lo += r;
    else *hi += r;
  }
}

/* A source for `v` (its extents and strides set): random bytes, its first element
 * misaligned by 0 .. 15 bytes where `misalign`. Returns the block to free. */
static char* make_source(view* v, int misalign) {
  int64_t lo, hi;
  size_t bytes;
  char* block;
  reach(v, &lo, &hi);
  bytes = (size_t)(hi - lo + 1) * v->size + 16;
  block = malloc(bytes);
  if (block == NULL) abort();
  fill_random(block, bytes);
  v->src = block + (misalign ? pick(0, 15) : 0) - lo * (int64_t)v->size;
  return block;
}

/* ---- Runs -------------------------------------------------------------------------- */

static long cases_run = 0;

static void show(const view* v, const char* what, int nparts, int fresh, int64_t at) {
  int d;
  fprintf(stderr, "MISMATCH (%s): size %zu cast %d nparts %d fresh %d, byte %lld of the block;"
          " shape", what, v->size, (int)v->cast, nparts, fresh, (long long)at);
  for (d = 0; d < v->ndim; d++) fprintf(stderr, " %lld", (long long)v->shape[d]);
  fprintf(stderr, " strides");
  for (d = 0; d < v->ndim; d++) fprintf(stderr, " %lld", (long long)v->strides[d]);
  fprintf(stderr, "\n");
}

static int64_t first_difference(const char* a, const char* b, size_t n) {
  size_t i;
  if (memcmp(a, b, n) == 0) return -1;
  for (i = 0; a[i] == b[i]; i++) {
  }
  return (int64_t)i;
}

/* Copies `v` (by the baseline where `base`) in `nparts` parts into `block` at GUARD +
 * `shift` bytes, guards around it; 0 when the block's `n` bytes, guards included, are
 * `want`'s. */
static int check_kernel(int base, const view* v, char* block, const char* want, size_t n,
                        int nparts, int fresh, size_t shift) {
  int64_t at;
  memset(block, 0xA5, n);
  copy_parts(base, block + GUARD + shift, v, fresh, nparts);
  at = first_difference(block, want, n);
  if (at < 0) return 0;
  show(v, base ? "baseline" : "kernel", nparts, fresh, at);
  return 1;
}

/* Every way of copying `v`: whole and in 2 and 3 parts, fresh or not, into a destination
 * aligned to 16 bytes and not; 0 when each gave the reference's bytes. */
static int check_view(const view* v) {
  const size_t shifts[] = {0, 4};
  const size_t n = (size_t)elements(v) * out_size(v->size, v->cast) + 2 * GUARD + 64;
  char* want = malloc(n);
  char* block = aligned_alloc(64, (n + 63) / 64 * 64);
  int nparts, fresh, s, bad = 0;
  if (want == NULL || block == NULL) abort();
  for (s = 0; s < 2 && !bad; s++) {
    memset(want, 0xA5, n);
    ref_gather(want + GUARD + shifts[s], v);
    for (nparts = 1; nparts <= 3 && !bad; nparts++) {
      for (fresh = 0; fresh <= 1 && !bad; fresh++) {
        bad = check_kernel(0, v, block, want, n, nparts, fresh, shifts[s]);
#ifdef DL_BASELINE_HEADER
        bad = bad || check_kernel(1, v, block, want, n, nparts, fresh, shifts[s]);
#endif
        cases_run++;
      }
    }
  }
  free(want);
  free(block);
  return bad;
}

static int random_views(int count, int64_t budget) {
  int i, bad = 0;
  for (i = 0; i < count && !bad; i++) {
    view v;
    char* block;
    memset(&v, 0, sizeof v);
    v.ndim = (int)pick(0, 5);
    v.size = pick_size(&v.cast);
    pick_shape(&v, budget);
    pick_strides(&v);
    block = make_source(&v, (int)pick(0, 1));
    bad = check_view(&v);
    free(block);
  }
  return bad;
}

/* ---- Large views: 4 MiB and more of destination ------------------------------------ */

/* A row-major block of `ndim` extents viewed through `perm` (view axis d is block axis
 * perm[d]) and `step` (per view axis; negative: from the end, 0: a broadcast of one
 * element), the last view axis cut to `take` elements where that is not 0. */
typedef struct {
  const char* name;
  int ndim;
  int64_t block[4]; /* the block's extents, row-major */
  int perm[4];
  int64_t step[4];
  int64_t take;
  size_t size;
  dl_copy_cast cast;
} large_case;

static const large_case LARGE[] = {
    {"dense float32, 4 MiB + 64 B", 1, {(1 << 20) + 16}, {0}, {1}, 0, 4, DL_COPY_SAME},
    {"rows of bytes with gaps", 2, {1024, 4100}, {0, 1}, {1, 1}, 4099, 1, DL_COPY_SAME},
    {"x.T float32", 2, {1024, 1030}, {1, 0}, {1, 1}, 0, 4, DL_COPY_SAME},
    {"x.T uint8", 2, {2050, 2048}, {1, 0}, {1, 1}, 0, 1, DL_COPY_SAME},
    {"x.T uint16, reversed", 2, {1500, 1500}, {1, 0}, {-1, 1}, 0, 2, DL_COPY_SAME},
    {"x.T float64 -> float32", 2, {1030, 1024}, {1, 0}, {1, 1}, 0, 8, DL_COPY_F64_F32},
    {"x.T complex128 -> complex64", 2, {700, 768}, {1, 0}, {1, 1}, 0, 16, DL_COPY_F64_F32},
    {"x.T 16-byte", 2, {520, 512}, {1, 0}, {1, 1}, 0, 16, DL_COPY_SAME},
    {"transposed slice", 2, {1100, 1030}, {1, 0}, {1, 1}, 1000, 4, DL_COPY_SAME},
    {"NCHW -> NHWC float32", 4, {2, 8, 256, 260}, {0, 2, 3, 1}, {1, 1, 1, 1}, 0, 4,
     DL_COPY_SAME},
    {"every other float32", 2, {1024, 2048}, {0, 1}, {1, 2}, 0, 4, DL_COPY_SAME},
    {"every other int64 -> int32", 1, {1 << 21}, {0}, {2}, 0, 8, DL_COPY_U64_U32},
    {"dense float64 -> float32", 1, {(1 << 20) + 3}, {0}, {1}, 0, 8, DL_COPY_F64_F32},
    {"reversed int16", 2, {1024, 2048}, {0, 1}, {-1, -1}, 0, 2, DL_COPY_SAME},
    {"broadcast rows of bytes", 2, {4100, 1024}, {0, 1}, {0, 1}, 0, 1, DL_COPY_SAME},
    {"broadcast int32", 2, {1030, 1024}, {0, 1}, {1, 0}, 0, 4, DL_COPY_SAME},
    {"pixels: 3 of 4 bytes", 2, {1 << 21, 4}, {0, 1}, {1, 1}, 3, 1, DL_COPY_SAME},
};

/* The view of `c`: its strides, extents and a random source. Returns the block to free. */
static char* large_view(const large_case* c, view* v) {
  int64_t bstride[4] = {0};
  int64_t start = 0;
  int d;
  char* block;
  size_t bytes = c->size;
  memset(v, 0, sizeof *v);
  v->ndim = c->ndim;
  v->size = c->size;
  v->cast = c->cast;
  for (d = c->ndim - 1; d >= 0; d--) {
    bstride[d] = d == c->ndim - 1 ? 1 : bstride[d + 1] * c->block[d + 1];
  }
  bytes *= (size_t)(bstride[0] * c->block[0]);
  for (d = 0; d < c->ndim; d++) {
    const int64_t b = c->perm[d];
    const int64_t s = c->step[d] < 0 ? -c->step[d] : c->step[d];
    v->shape[d] = s == 0 ? c->block[b] : c->block[b] / s;
    v->strides[d] = bstride[b] * c->step[d];
    if (c->step[d] < 0) start += (c->block[b] - 1) * bstride[b];
  }
  if (c->take > 0) v->shape[c->ndim - 1] = c->take;
  block = malloc(bytes + 16);
  if (block == NULL) abort();
  fill_random(block, bytes + 16);
  v->src = block + 1 + start * (int64_t)c->size; /* misaligned by a byte */
  return block;
}

static int large_views(void) {
  size_t i;
  int bad = 0;
  for (i = 0; i < sizeof LARGE / sizeof LARGE[0] && !bad; i++) {
    view v;
    char* block = large_view(&LARGE[i], &v);
    bad = check_view(&v);
    free(block);
  }
  return bad;
}

/* ---- Timing (--bench, with a baseline) --------------------------------------------- */

#ifdef DL_BASELINE_HEADER
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int by_value(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double median(double* t, int n) {
  qsort(t, (size_t)n, sizeof t[0], by_value);
  return t[n / 2];
}

typedef struct {
  const char* name;
  int64_t rows, cols; /* a row-major block of rows x cols elements */
  int transpose;
  int64_t col_step;   /* 1, or 2: every other element along a row (cols / 2 of them) */
  size_t size;
  dl_copy_cast cast;
} bench_case;

static const bench_case BENCH[] = {
    {"4 MiB contiguous float32", 1024, 1024, 0, 1, 4, DL_COPY_SAME},
    {"64 MiB contiguous float32", 4096, 4096, 0, 1, 4, DL_COPY_SAME},
    {"4 MiB transposed 2-D float32", 1024, 1024, 1, 1, 4, DL_COPY_SAME},
    {"64 MiB transposed 2-D float32", 4096, 4096, 1, 1, 4, DL_COPY_SAME},
    {"4 MiB transposed 2-D uint8", 2048, 2048, 1, 1, 1, DL_COPY_SAME},
    {"4 MiB every other float32", 1024, 2048, 0, 2, 4, DL_COPY_SAME},
    {"64 MiB every other float32", 4096, 8192, 0, 2, 4, DL_COPY_SAME},
    {"4 MiB float64 -> float32", 1024, 1024, 0, 1, 8, DL_COPY_F64_F32},
    {"64 MiB float64 -> float32", 4096, 4096, 0, 1, 8, DL_COPY_F64_F32},
    {"4 MiB short rows (every other of 9)", 262144, 9, 0, 2, 4, DL_COPY_SAME},
    {"256 KiB transposed 2-D float32", 256, 256, 1, 1, 4, DL_COPY_SAME},
};

/* Times case `c`, whole or in its two halves one after the other (part 0 from the worker's
 * call site): the baseline and the kernel in turn, `repeats` times after two rounds to warm
 * up, into memory written before; prints the medians and their ratio. 1 where the two
 * wrote different bytes. */
static int bench_case_timed(const bench_case* c, int halves, int repeats) {
  const size_t in = (size_t)(c->rows * c->cols) * c->size;
  char* src = malloc(in);
  view v;
  size_t n;
  char* dst[2];
  double* t[2];
  int r, k;
  if (src == NULL) abort();
  fill_random(src, in);
  memset(&v, 0, sizeof v);
  v.ndim = 2;
  v.size = c->size;
  v.cast = c->cast;
  v.src = src;
  v.shape[0] = c->transpose ? c->cols : c->rows;
  v.shape[1] = (c->transpose ? c->rows : c->cols) / c->col_step;
  v.strides[0] = c->transpose ? 1 : c->cols;
  v.strides[1] = c->transpose ? c->cols : c->col_step;
  n = (size_t)elements(&v) * out_size(v.size, v.cast);
  for (k = 0; k < 2; k++) {
    dst[k] = aligned_alloc(64, (n + 63) / 64 * 64);
    t[k] = malloc(sizeof(double) * (size_t)repeats);
    if (dst[k] == NULL || t[k] == NULL) abort();
    memset(dst[k], k, n);
  }
  for (r = -2; r < repeats; r++) { /* two rounds to warm up; then each in turn */
    for (k = 0; k < 2; k++) {
      const int which = (r + k) & 1; /* who goes first alternates */
      const double t0 = now();
      copy_parts(which == 0, dst[which], &v, 0, 1 + halves);
      if (r >= 0) t[which][r] = now() - t0;
    }
  }
  k = memcmp(dst[0], dst[1], n) != 0;
  if (k) {
    fprintf(stderr, "MISMATCH in the timed copy %s\n", c->name);
  } else {
    const double base = median(t[0], repeats) * 1e3, kernel = median(t[1], repeats) * 1e3;
    printf("%-36s %-7s %11.3f %11.3f %7.3f\n", c->name, halves ? "halves" : "whole", base,
           kernel, kernel / base);
    fflush(stdout);
  }
  free(src);
  free(dst[0]);
  free(dst[1]);
  free(t[0]);
  free(t[1]);
  return k;
}

/* Times every BENCH case whole, then in halves: one line each. */
static int bench(int repeats) {
  size_t i;
  int halves;
  printf("%-44s %11s %11s %7s\n", "copy (one thread, memory reused)", "baseline ms",
         "kernel ms", "ratio");
  for (halves = 0; halves <= 1; halves++) {
    for (i = 0; i < sizeof BENCH / sizeof BENCH[0]; i++) {
      if (bench_case_timed(&BENCH[i], halves, repeats)) return 1;
    }
  }
  return 0;
}
#endif

int main(int argc, char** argv) {
  int bad;
  const int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
#ifdef DL_BASELINE_HEADER
  if (argc > 1 && strcmp(argv[1], "--bench") == 0) {
    return bench(argc > 2 ? atoi(argv[2]) : 31);
  }
#endif
  printf("copy_harness: SSE2 %s, stream from %zu B, panels %d x %d B%s\n",
         DL_COPY_SSE2 ? "on" : "off", (size_t)DL_COPY_STREAM_MIN, DL_PANEL_J, DL_PANEL_I,
#ifdef DL_BASELINE_HEADER
         ", baseline compared too"
#else
         ""
#endif
  );
  bad = random_views(quick ? 2000 : 20000, 1 << 12);
  if (!bad) bad = random_views(quick ? 200 : 2000, 1 << 16);
  printf("random views: %ld copies %s\n", cases_run, bad ? "FAILED" : "matched");
  if (!bad && !quick) {
    cases_run = 0;
    bad = large_views();
    printf("large views: %ld copies %s\n", cases_run, bad ? "FAILED" : "matched");
  }
  return bad;
}
