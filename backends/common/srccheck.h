/*
 * Raw kernels cannot touch the file system.  A client's kernel source is
 * compiled by the daemon (NVRTC, glslang), and every one of those compilers
 * can open files named in the source: #include (and #include_next, #import,
 * #embed), __has_include, and pragmas that name files.  Opening is refused
 * before the compiler runs, from the text alone, so the answer is the same
 * whether or not the named file exists and no byte of it is ever read.
 *
 * The scan follows the preprocessor's lexing: line splices, comments,
 * string and character literals and raw strings (CUDA only: GLSL has no
 * literals, so a quote hides nothing there), the alternative spellings of
 * '#' (%:, and ??= in CUDA), and whitespace or comments between '#' and the
 * directive's name.  Where compilers may read a source two ways, it is
 * scanned both ways and refused if either finds something: CUDA with and
 * without trigraphs, GLSL with and without line splices (glslang splices
 * only from GLSL 4.20 on, in comments too).  It is
 * deliberately stricter than the compiler: a directive inside #if 0 or a
 * macro body is refused too.  The daemon's own kernels include nothing
 * (backends/kernels/ concatenates the prelude), so the rule has no
 * exceptions.  Called by every compiler entry: dspk__cuda_compile (NVRTC,
 * which has no include callback at all) and the Vulkan backend's GLSL
 * compile (glslang); a hiprtc backend would call it with DSPK__SRC_CUDA.
 */
#ifndef DSPK_BACKENDS_COMMON_SRCCHECK_H
#define DSPK_BACKENDS_COMMON_SRCCHECK_H

#include <stddef.h>

enum dspk__src_lang { DSPK__SRC_CUDA, DSPK__SRC_GLSL };

/* 0 when src[0..len) asks the compiler to open no file; else DSPK_ECOMPILE
 * with msg set to "<name>:<line>: <what> is refused: raw kernels cannot
 * read files ...", naming only the directive (never the file). */
int dspk__src_check(const char *src, size_t len, enum dspk__src_lang lang, const char *name,
                    char *msg, size_t msglen);

#endif
