/* Allowed: the daemon uses the backend table, the wire format, the cache
 * and its own headers (tests/layers). */
#include "backends/backend.h"
#include "cache/cache.h"
#include "daemon/dspkd.h"
#include "dspk/errors.h"
#include "proto/codec.h"

int dspk_layers_ok(void) { return DSPK_PROTOCOL_VERSION; }
typedef int dspk_layers_nonempty;
