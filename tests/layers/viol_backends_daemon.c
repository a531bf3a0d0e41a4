/* Refused: no backend includes a daemon header (tests/layers). */
#include "daemon/dspkd.h"
typedef int dspk_layers_nonempty;
