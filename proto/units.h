/*
 * Sizes with unit suffixes, as every size flag and size key takes them
 * (dspkd's --max-message and max_message, dspk-submit's --size): one parser
 * for the daemon and the CLI.  Pure functions, no I/O.
 */
#ifndef DSPK_PROTO_UNITS_H
#define DSPK_PROTO_UNITS_H

#include <stddef.h>
#include <stdint.h>

/*
 * Parses a byte count: decimal digits, then optionally one binary unit,
 * K or KiB (2^10), M or MiB (2^20), G or GiB (2^30), T or TiB (2^40); no
 * sign, no spaces, no fraction ("2M", "64KiB", "4096").  Returns 0 and
 * *out, or -1 for anything else or a value above UINT64_MAX.
 */
int dspk__parse_size(const char *s, uint64_t *out);

/* What dspk__parse_size takes, in the words of every message that refuses a
 * size (dspkd's options and configuration keys, dspk-submit's options and
 * size variables): both spellings of each unit, as dspk.conf(5), dspkd(8)
 * and docs/cli.md list them (probe 23 D2: "suffix K, M, G or T allowed"
 * told a user who typed 1Mib that MiB was wrong). */
#define DSPK__SIZE_UNITS "digits and an optional unit K, M, G, T or KiB, MiB, GiB, TiB"

/* The most device UUIDs job.register takes (its devices array). */
#define DSPK__JOB_MAX_UUIDS 64

/* The size of a normalised device UUID with its NUL: at most 39 hex
 * digits (job.register's devices[]). */
#define DSPK__UUID_LEN 40

/* What a job.register devices[] item that is not a UUID is told it should
 * be, whether it is no string or a string that breaks the rule below
 * ("devices[0]: expected <this>, got true" and "...: byte 1 is not a hex
 * digit or a dash"; probe 22 A2: the first said "a device UUID, a str"). */
#define DSPK__EXPECT_UUID "a device UUID (hex digits and dashes, after an optional GPU- prefix)"

/*
 * A device UUID as job.register takes it (docs/protocol.md) and
 * dspk-submit's job register --devices checks it before sending: an
 * optional GPU- prefix (nvidia-smi's, any case), then hex digits and
 * dashes only, 1 to DSPK__UUID_LEN - 1 digits.  out gets its digits, lower
 * case.  Returns 0, or -1 with why ("byte 3 is not a hex digit or a dash",
 * "more than 39 hex digits", "no hex digits") written into why.
 */
int dspk__uuid_parse(const char *in, size_t len, char out[DSPK__UUID_LEN], char *why,
                     size_t wlen);

#endif /* DSPK_PROTO_UNITS_H */
