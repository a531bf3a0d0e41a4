/* Refused: what the backends share is theirs, not the daemon's
 * (tests/layers). */
#include "backends/common/pool.h"
typedef int dspk_layers_nonempty;
