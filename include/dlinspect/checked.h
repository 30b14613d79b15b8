/* dlinspect's int64 arithmetic with an overflow check (src/header.pxi, src/needs.pxi): the
 * GCC/Clang builtins, and a portable check elsewhere (MSVC). */
#ifndef DLINSPECT_CHECKED_H_
#define DLINSPECT_CHECKED_H_

#include <stdint.h>

/* contract: *out = a * b; returns 1 when that overflows int64 (then *out is unspecified). */
static inline int dl_mul_overflow(int64_t a, int64_t b, int64_t* out) {
#if defined(__GNUC__) || defined(__clang__)
  return __builtin_mul_overflow(a, b, out);
#else
  /* a or b 0 passes every test; -1 * INT64_MIN (either order) fails the one of two negatives */
  if ((a > 0 && b > 0 && a > INT64_MAX / b) || (a < 0 && b < 0 && a < INT64_MAX / b) ||
      (a > 0 && b < 0 && b < INT64_MIN / a) || (a < 0 && b > 0 && a < INT64_MIN / b)) {
    return 1;
  }
  *out = a * b;
  return 0;
#endif
}

/* contract: *out = a + b; returns 1 when that overflows int64 (then *out is unspecified). */
static inline int dl_add_overflow(int64_t a, int64_t b, int64_t* out) {
#if defined(__GNUC__) || defined(__clang__)
  return __builtin_add_overflow(a, b, out);
#else
  if ((b > 0 && a > INT64_MAX - b) || (b < 0 && a < INT64_MIN - b)) return 1;
  *out = a + b;
  return 0;
#endif
}

#endif /* DLINSPECT_CHECKED_H_ */
