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

/* contract: 1 when the page holding address `p` is mapped in this process, else 0; asks the
   system (mincore, VirtualQuery), never reads `p`, so any address is safe to ask about. */
static inline int dl_mapped(uintptr_t p) {
#if defined(_WIN32)
  MEMORY_BASIC_INFORMATION info;
  return VirtualQuery((LPCVOID)p, &info, sizeof info) != 0 && info.State == MEM_COMMIT;
#else
  /* (handed over as void*: macOS's mincore takes a char*, Linux's an unsigned char*) */
  unsigned char page_state;
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  return mincore((void*)(p & ~(page - 1)), 1, (void*)&page_state) == 0;
#endif
}

#endif /* DLINSPECT_CHECKED_H_ */
