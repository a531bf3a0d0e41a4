/*
 * Sizes with unit suffixes, as every size flag and size key takes them
 * (dspkd's --max-message and max_message, dspk-submit's --size): one parser
 * for the daemon and the CLI.  Pure functions, no I/O.
 */
#ifndef DSPK_PROTO_UNITS_H
#define DSPK_PROTO_UNITS_H

#include <stdint.h>

/*
 * Parses a byte count: decimal digits, then optionally one binary unit,
 * K or KiB (2^10), M or MiB (2^20), G or GiB (2^30), T or TiB (2^40); no
 * sign, no spaces, no fraction ("2M", "64KiB", "4096").  Returns 0 and
 * *out, or -1 for anything else or a value above UINT64_MAX.
 */
int dspk__parse_size(const char *s, uint64_t *out);

#endif /* DSPK_PROTO_UNITS_H */
