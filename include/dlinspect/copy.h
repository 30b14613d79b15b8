/* dlinspect's copies of host tensors: one pass over the source, at memory speed, with no
 * Python object and no GIL. Used by src/capsules.pxi (_aligned_copy).
 *
 * The source is a DLTensor's memory as its header says: extents and strides in
 * elements (any sign, 0 for a broadcast axis), validated by TensorInfo so that every
 * element address lies inside the producer's claimed memory. Elements may be
 * misaligned for their type (DLPack allows it): each is loaded with memcpy, which
 * compilers turn into one unaligned load. */
#ifndef DLINSPECT_COPY_H_
#define DLINSPECT_COPY_H_

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

/* How each element is written: as it is, or narrowed as JAX narrows with x64 off. */
typedef enum {
  DL_COPY_SAME = 0,      /* the bytes as they are */
  DL_COPY_F64_F32 = 1,   /* each 8-byte float rounded to float (complex: both parts) */
  DL_COPY_U64_U32 = 2,   /* each 8-byte integer's low 32 bits (wraps, as NumPy's cast) */
} dl_copy_cast;

/* contract: ask the kernel for transparent huge pages over [p, p + n) when n is at least
 * 4 MiB (as NumPy's allocator does), so that the first touch of a large copy faults
 * 2 MiB at a time; a no-op elsewhere or where the kernel declines. */
static inline void dl_advise_huge(void* p, size_t n) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  const uintptr_t page = 4096;
  if (n >= ((size_t)4 << 20)) {
    uintptr_t start = ((uintptr_t)p + page - 1) & ~(page - 1);
    uintptr_t end = ((uintptr_t)p + n) & ~(page - 1);
    if (end > start) {
      (void)madvise((void*)start, end - start, MADV_HUGEPAGE);
    }
  }
#else
  (void)p;
  (void)n;
#endif
}

/* contract: writes `count` elements of `src_size` bytes from `src` (a run with a
 * stride of `step` elements) into `dst` packed, as `cast` says; dst and src do not
 * overlap. */
static inline char* dl_copy_run(char* restrict dst, const char* restrict src, int64_t count,
                                int64_t step, size_t src_size, dl_copy_cast cast) {
  const int64_t step_bytes = step * (int64_t)src_size;
  int64_t i;
  if (cast == DL_COPY_SAME) {
    if (step == 1) {
      memcpy(dst, src, (size_t)count * src_size);
      return dst + (size_t)count * src_size;
    }
    switch (src_size) { /* one fixed-size load and store per element */
#define DL_RUN(N)                                                \
  case N:                                                        \
    if (step == 2) { /* every other element: a constant stride, which compilers  \
                        vectorise with shuffles */               \
      for (i = 0; i < count; i++) {                              \
        memcpy(dst + (size_t)i * N, src + i * 2 * N, N);         \
      }                                                          \
    } else {                                                     \
      for (i = 0; i < count; i++) {                              \
        memcpy(dst + (size_t)i * N, src + i * step_bytes, N);    \
      }                                                          \
    }                                                            \
    break;
      DL_RUN(1) DL_RUN(2) DL_RUN(4) DL_RUN(8) DL_RUN(16)
#undef DL_RUN
      default:
        for (i = 0; i < count; i++) {
          memcpy(dst + (size_t)i * src_size, src + i * step_bytes, src_size);
        }
    }
    return dst + (size_t)count * src_size;
  }
  /* Narrowing: 8-byte parts to 4-byte ones (complex128: two parts per element); a dense
   * run is one loop over its parts, which compilers vectorise. */
  const int64_t parts = (int64_t)(src_size / 8), total = count * parts;
  int64_t p;
#define DL_NARROW(WIDE, NARROW)                                     \
  {                                                                 \
    NARROW* restrict out = (NARROW*)dst;                            \
    if (step == 1) {                                                \
      for (i = 0; i < total; i++) {                                 \
        WIDE w;                                                     \
        memcpy(&w, src + 8 * i, 8);                                 \
        out[i] = (NARROW)w;                                         \
      }                                                             \
    } else {                                                        \
      for (i = 0; i < count; i++) {                                 \
        for (p = 0; p < parts; p++) {                               \
          WIDE w;                                                   \
          memcpy(&w, src + i * step_bytes + 8 * p, 8);              \
          out[i * parts + p] = (NARROW)w;                           \
        }                                                           \
      }                                                             \
    }                                                               \
  }
  if (cast == DL_COPY_F64_F32) {
    DL_NARROW(double, float)
  } else {
    DL_NARROW(uint64_t, uint32_t) /* the low 32 bits: wraps, as NumPy's cast */
  }
#undef DL_NARROW
  return dst + (size_t)total * 4;
}

/* contract: copies the `ndim`-d tensor at `src` (extents `shape`, strides `strides` in
 * elements of `src_size` bytes) into `dst` in row-major order, each element as `cast`
 * says; `dst` holds every element. ndim <= 64 (TensorInfo's bound); an empty tensor
 * writes nothing. The innermost axis is one run (a memcpy where its stride is 1). */
static inline void dl_gather(char* restrict dst, const char* restrict src, int ndim,
                             const int64_t* shape, const int64_t* strides, size_t src_size,
                             dl_copy_cast cast) {
  int64_t ext[64], str[64], idx[64];
  int n = 0, d;
  for (d = 0; d < ndim; d++) {
    if (shape[d] == 0) return;
    if (shape[d] == 1) continue; /* its stride never moves the pointer */
    /* Merge with the axis before when together they are one run of the inner stride. */
    if (n > 0 && str[n - 1] == strides[d] * shape[d]) {
      ext[n - 1] *= shape[d];
      str[n - 1] = strides[d];
      continue;
    }
    ext[n] = shape[d];
    str[n] = strides[d];
    idx[n] = 0;
    n++;
  }
  if (n == 0) { /* one element */
    dl_copy_run(dst, src, 1, 1, src_size, cast);
    return;
  }
  const int64_t inner = ext[n - 1], step = str[n - 1];
  int64_t off = 0; /* bytes from src to the row's first element: always inside the tensor */
  for (;;) {
    dst = dl_copy_run(dst, src + off, inner, step, src_size, cast);
    /* Next row: the odometer over the outer axes. */
    for (d = n - 2; d >= 0; d--) {
      if (++idx[d] < ext[d]) {
        off += str[d] * (int64_t)src_size;
        break;
      }
      off -= (ext[d] - 1) * str[d] * (int64_t)src_size;
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

#endif /* DLINSPECT_COPY_H_ */
