/*
 * numpy .npz archives for dspk-submit (npy.h: dspk__npz_load).
 *
 * An .npz is a zip archive with one .npy per array, named NAME.npy after
 * the keyword given to numpy.savez; numpy.savez stores the members,
 * numpy.savez_compressed deflates them, and both may write zip64 headers.
 * libzip reads the archive (central directory, zip64, deflate through
 * zlib, the CRC check); this file only picks the member, reads it whole
 * into memory (its declared size is allocated, and exactly that many bytes
 * must come out) and hands the image to the .npy parser, which checks it
 * like a file.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zip.h>

#include "client/submit/npy.h"
#include "dspk/errors.h"

/* Lists the arrays of the archive ("a, b, c") into buf. */
static void list_members(zip_t *za, char *buf, size_t cap) {
  zip_int64_t n = zip_get_num_entries(za, 0);
  size_t used = 0;
  buf[0] = '\0';
  for (zip_int64_t i = 0; i < n && used + 1 < cap; i++) {
    const char *name = zip_get_name(za, (zip_uint64_t)i, 0);
    size_t len;
    int w;
    if (name == NULL)
      continue;
    len = strlen(name);
    if (len > 4 && strcmp(name + len - 4, ".npy") == 0)
      len -= 4;
    w = snprintf(buf + used, cap - used, "%s%.*s", used ? ", " : "", (int)len, name);
    if (w < 0 || (size_t)w >= cap - used) {
      if (cap > 6)
        memcpy(buf + cap - 6, ", ...", 6); /* cut: say so */
      return;
    }
    used += (size_t)w;
  }
}

static int fail(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(char *err, size_t errlen, int code, const char *fmt, ...) {
  va_list ap;
  if (err != NULL && errlen > 0) {
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return code;
}

int dspk__npz_load(const char *path, const char *member, dspk__npy *out,
                   char *err, size_t errlen) {
  char names[256], full[512], label[600];
  zip_t *za;
  zip_file_t *zf = NULL;
  zip_stat_t st;
  zip_int64_t idx = -1, got;
  unsigned char *buf = NULL, extra;
  int zerr = 0, rc;

  za = zip_open(path, ZIP_RDONLY, &zerr);
  if (za == NULL) {
    zip_error_t ze;
    zip_error_init_with_code(&ze, zerr);
    rc = fail(err, errlen,
              zerr == ZIP_ER_NOENT                      ? DSPK_ENOENT
              : zerr == ZIP_ER_OPEN || zerr == ZIP_ER_READ ? DSPK_EIO
              : zerr == ZIP_ER_MEMORY                   ? DSPK_ENOMEM
                                                        : DSPK_EINVAL,
              "%s: %s%s", path, zip_error_strerror(&ze),
              zerr == ZIP_ER_NOZIP ? " (an .npz is a zip archive)" : "");
    zip_error_fini(&ze);
    return rc;
  }
  list_members(za, names, sizeof names);
  if (member == NULL) {
    if (zip_get_num_entries(za, 0) != 1) {
      rc = fail(err, errlen, DSPK_EINVAL,
                "%s: the archive holds %lld arrays (%s); name one as %s:NAME",
                path, (long long)zip_get_num_entries(za, 0), names, path);
      goto out;
    }
    idx = 0;
    snprintf(label, sizeof label, "%s", path);
  } else {
    if (member[0] == '\0') {
      rc = fail(err, errlen, DSPK_EINVAL, "%s: empty array name after ':'", path);
      goto out;
    }
    snprintf(full, sizeof full, "%s.npy", member);
    idx = zip_name_locate(za, full, 0);
    if (idx < 0)
      idx = zip_name_locate(za, member, 0);
    snprintf(label, sizeof label, "%s:%s", path, member);
    if (idx < 0) {
      rc = fail(err, errlen, DSPK_ENOENT, "%s: no array '%s' in the archive (it has: %s)",
                path, member, names[0] ? names : "nothing");
      goto out;
    }
  }
  if (zip_stat_index(za, (zip_uint64_t)idx, 0, &st) != 0 || !(st.valid & ZIP_STAT_SIZE)) {
    rc = fail(err, errlen, DSPK_EINVAL, "%s: %s", label, zip_strerror(za));
    goto out;
  }
  if (st.size > SIZE_MAX - 1 || (buf = malloc(st.size ? (size_t)st.size : 1)) == NULL) {
    rc = fail(err, errlen, DSPK_ENOMEM, "%s: out of memory for %llu bytes", label,
              (unsigned long long)st.size);
    goto out;
  }
  zf = zip_fopen_index(za, (zip_uint64_t)idx, 0);
  if (zf == NULL) {
    rc = fail(err, errlen, DSPK_EINVAL, "%s: %s", label, zip_strerror(za));
    goto out;
  }
  for (zip_uint64_t done = 0; done < st.size; done += (zip_uint64_t)got) {
    got = zip_fread(zf, buf + done, st.size - done);
    if (got <= 0) {
      rc = fail(err, errlen, DSPK_EINVAL, "%s: %s", label,
                got < 0 ? zip_file_strerror(zf) : "member shorter than its header says");
      goto out;
    }
  }
  /* Reading past the end checks the CRC and that no bytes are left. */
  got = zip_fread(zf, &extra, 1);
  if (got != 0) {
    rc = fail(err, errlen, DSPK_EINVAL, "%s: %s", label,
              got < 0 ? zip_file_strerror(zf) : "member longer than its header says");
    goto out;
  }
  rc = dspk__npy_adopt(buf, (size_t)st.size, label, out, err, errlen);
  buf = NULL; /* adopted, or freed */
out:
  free(buf);
  if (zf != NULL)
    zip_fclose(zf);
  zip_discard(za);
  return rc;
}
