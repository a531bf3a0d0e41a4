/* Refused: the daemon uses the backend table, not a backend's internals
 * (tests/layers). */
#include "backends/cpu/cpu.h"
typedef int dspk_layers_nonempty;
