/*
 * Sizes with unit suffixes and device UUIDs (proto/units.h).
 */
#include "proto/units.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

int dspk__parse_size(const char *s, uint64_t *out) {
  static const struct {
    const char *name;
    unsigned shift;
  } units[] = {{"", 0},    {"K", 10},  {"KiB", 10}, {"M", 20}, {"MiB", 20},
               {"G", 30},  {"GiB", 30}, {"T", 40},  {"TiB", 40}};
  uint64_t v = 0;
  const char *p = s;

  if (s == NULL || *p < '0' || *p > '9')
    return -1;
  for (; *p >= '0' && *p <= '9'; p++) {
    unsigned d = (unsigned)(*p - '0');
    if (v > (UINT64_MAX - d) / 10)
      return -1;
    v = v * 10 + d;
  }
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
    if (strcmp(p, units[i].name) != 0)
      continue;
    if (units[i].shift && v > (UINT64_MAX >> units[i].shift))
      return -1;
    *out = v << units[i].shift;
    return 0;
  }
  return -1;
}

int dspk__uuid_parse(const char *in, size_t len, char out[DSPK__UUID_LEN], char *why,
                     size_t wlen) {
  size_t n = 0, i = len >= 4 && strncasecmp(in, "GPU-", 4) == 0 ? 4 : 0;
  for (; i < len; i++) {
    if (in[i] == '-')
      continue;
    if (!isxdigit((unsigned char)in[i])) {
      snprintf(why, wlen, "byte %zu is not a hex digit or a dash", i + 1);
      return -1;
    }
    if (n + 1 >= DSPK__UUID_LEN) {
      snprintf(why, wlen, "more than %d hex digits", DSPK__UUID_LEN - 1);
      return -1;
    }
    out[n++] = (char)tolower((unsigned char)in[i]);
  }
  out[n] = '\0';
  if (n == 0) {
    snprintf(why, wlen, "no hex digits");
    return -1;
  }
  return 0;
}
