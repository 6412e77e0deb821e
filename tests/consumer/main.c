/* Consumer of an installed ndx: prints the version and checks that the library and the
 * header it was compiled against agree. Exits non-zero on mismatch. */
#include <stdio.h>
#include <string.h>

#include <ndx.h>

int main(void) {
  const unsigned expected =
      NDX_VERSION_MAJOR * 10000u + NDX_VERSION_MINOR * 100u + NDX_VERSION_PATCH;
  const unsigned got = (unsigned)ndx_version();
  const char* s = ndx_version_string();

  printf("ndx %s (ndx_version() = %u, header %s)\n", s ? s : "(null)", got, NDX_VERSION_STRING);
  if (got != expected) {
    fprintf(stderr, "ndx_version() = %u, header says %u\n", got, expected);
    return 1;
  }
  if (s == NULL || strcmp(s, NDX_VERSION_STRING) != 0) {
    fprintf(stderr, "ndx_version_string() = \"%s\", header says \"%s\"\n", s ? s : "(null)",
            NDX_VERSION_STRING);
    return 1;
  }
  return 0;
}
