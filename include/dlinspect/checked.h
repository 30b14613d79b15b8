/* What dlinspect checks before it trusts a header (src/header.pxi, src/needs.pxi): int64
 * arithmetic with an overflow check (the GCC/Clang builtins, a portable check elsewhere:
 * MSVC), and whether an address lies in memory this process has mapped. */
#ifndef DLINSPECT_CHECKED_H_
#define DLINSPECT_CHECKED_H_

#include <stdint.h>
#if defined(_WIN32)
#include <windows.h>
#else
#include <sys/mman.h>
#include <unistd.h>
#endif

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

/* Where a process's user addresses end: x86-64 (Linux, macOS, Windows) 2**47, arm64 2**48
   (wider only for memory a process maps at a higher address on purpose); elsewhere the
   end of the pointer's range. */
#if defined(__x86_64__) || defined(_M_X64)
#define DL_USER_END ((uintptr_t)1 << 47)
#elif defined(__aarch64__) || defined(_M_ARM64)
#define DL_USER_END ((uintptr_t)1 << 48)
#else
#define DL_USER_END UINTPTR_MAX
#endif

/* contract: 1 when every page of [lo, hi] is mapped in this process, else 0 (hi below
   DL_USER_END); asks the system (mincore a few thousand pages at a time, VirtualQuery a
   region at a time), never reads the memory, so any addresses are safe to ask about. */
static inline int dl_mapped(uintptr_t lo, uintptr_t hi) {
#if defined(_WIN32)
  MEMORY_BASIC_INFORMATION info;
  while (VirtualQuery((LPCVOID)lo, &info, sizeof info) != 0 && info.State == MEM_COMMIT) {
    lo = (uintptr_t)info.BaseAddress + info.RegionSize;
    if (lo > hi) return 1;
  }
  return 0;
#else
  unsigned char pages[4096];
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  uintptr_t step = page * sizeof pages;
  for (lo &= ~(page - 1); lo <= hi; lo += step) {
    /* (handed over as void*: macOS's mincore takes a char*, Linux's an unsigned char*) */
    if (mincore((void*)lo, hi - lo < step ? hi - lo + 1 : step, (void*)pages) != 0) return 0;
  }
  return 1;
#endif
}

#endif /* DLINSPECT_CHECKED_H_ */
