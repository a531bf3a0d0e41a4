/*
 * A client's raw-kernel source is compiled in a child process under limits.
 * A compiler front end amplifies its input: a 0.5 KiB GLSL source of nested
 * macros expands to 2^20 tokens and more, and glslang (or NVRTC, hiprtc)
 * then takes GiBs and minutes on the device's runner thread.  So the daemon
 * hands a client's source to a child (`EXE --kernel-compile LANG`, dspkd
 * itself, which runs dspk__kernel_compile_main) that may use at most
 * DSPK__KCOMPILE_MEM_MIB MiB of memory (RLIMIT_DATA: heap and private
 * writable mappings) beyond what it had once its compiler was loaded, and
 * DSPK__KCOMPILE_TIME_S seconds: past either the child is gone and
 * the task fails with DSPK_ELIMIT (docs/protocol.md, kernel).  A crash of
 * the compiler ends the child too, never the daemon.  The daemon's own
 * generated kernels are compiled in process (they are ours, and small).
 * The same child, as `EXE --kernel-compile vkpipe:INDEX:UUID`, makes a raw
 * kernel's Vulkan pipeline first on a software device (vk_shader.c: the
 * driver's LLVM compile, which a tiny module can make take minutes); the
 * messages then name "making the kernel's pipeline" and "the driver".  A
 * child starts with no signal blocked, whatever the runner thread blocks.
 *
 * Each child compiles one source.  A compiler's first compile sets up its
 * built-in tables (glslang: about 0.2 s of CPU), so a device keeps one
 * spare child started ahead that has done that with a trivial source and
 * waits for the next one: a client's compile does not pay it, and the next
 * spare starts once a compile is done.
 */
#ifndef DSPK_BACKENDS_COMMON_KCOMPILE_H
#define DSPK_BACKENDS_COMMON_KCOMPILE_H

#include <stdatomic.h>
#include <stddef.h>

/* The limits of one compile of a client's source (docs/protocol.md). */
#define DSPK__KCOMPILE_MEM_MIB 512
#define DSPK__KCOMPILE_TIME_S 5
/* How long a child may take to set up (start, open its device, compile a
 * warm-up source) before it says it is ready ("R" on its stdout): the
 * source's DSPK__KCOMPILE_TIME_S start then, so that a slow start (a
 * loaded machine, a sanitizer build) is never a client's ELIMIT. */
#define DSPK__KCOMPILE_SETUP_S 60
/* The most bytes of code a compile may give back. */
#define DSPK__KCOMPILE_OUT_MAX (64u << 20)

/* A compiler as the child runs it: 0 and a malloc'd *bin of *binlen bytes,
 * or a negative dspk_errno with log (NUL-terminated) set. */
typedef int dspk__kcompile_fn(void *ud, const char *src, size_t len, void **bin, size_t *binlen,
                              char *log, size_t loglen);

/* A device's spare child (pid 0: none).  Zero-initialised is empty. */
struct dspk__kcompile_spare {
  int pid;
  int in, out; /* the parent's ends: its stdin (a socket), its stdout */
  char lang[64];
};

/* The parent's side: hands src to a child running `exe --kernel-compile
 * lang` (spare's when it has one for lang, else a new one; then a new spare
 * is started: spare may be NULL) and waits for it, at most
 * DSPK__KCOMPILE_TIME_S seconds, and stops it as soon as *cancel (may be
 * NULL) is set.  Returns 0 with *bin (malloc'd) and *binlen; the compiler's
 * error (its log in log); DSPK_ELIMIT with log saying which limit the
 * compile went past; DSPK_ECANCELED; or DSPK_ENOMEM, DSPK_EIO when no child
 * could run.  Runs on a runner thread (the spare is that device's). */
int dspk__kcompile_run(struct dspk__kcompile_spare *spare, const char *exe, const char *lang,
                       const char *src, size_t len, atomic_int *cancel, void **bin,
                       size_t *binlen, char *log, size_t loglen);

/* Starts a spare child for lang ahead of its first compile when spare has
 * none (the next dspk__kcompile_run for lang takes it); nothing when it
 * cannot start (that run starts one). */
void dspk__kcompile_spare_start(struct dspk__kcompile_spare *spare, const char *exe,
                                const char *lang);

/* Ends the spare child, if any (a device's close). */
void dspk__kcompile_spare_end(struct dspk__kcompile_spare *spare);

/* The child's side: compiles warm (may be NULL) with fn to set the compiler
 * up, reads the source from stdin, sets the limits, runs fn and writes its
 * answer to stdout.  Returns the exit status (0 when an answer was written,
 * 2 when not, 3 out of memory). */
int dspk__kcompile_serve(dspk__kcompile_fn *fn, void *ud, const char *warm);

#endif
