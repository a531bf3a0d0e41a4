#!/bin/sh
# Copies VkFFT's single header (Debian's libvkfft-dev 1.2.26) into the build
# tree with the two fixes it needs to compile as C against glslang 12:
#  1. C has no empty initializer before C23: "= {}" becomes "= {0}";
#  2. its hand-written glslang_resource_t initializer predates glslang 12's
#     struct: each one becomes a copy of glslang_default_resource().
# Usage: vkfft-patch.sh SRC DST.  The source itself is never copied into the
# repository.
set -eu
src=$1
dst=$2
mkdir -p "$(dirname "$dst")"
{
  echo '#include <glslang/Public/resource_limits_c.h>'
  sed 's/= {};/= {0};/g' "$src" | awk '
    /const glslang_resource_t default_resource = \{/ {
      print "const glslang_resource_t default_resource = *glslang_default_resource();"
      skip = 1
      next
    }
    skip && /^[ \t]*\} \};[ \t]*$/ { skip = 0; next }
    !skip { print }
  '
} > "$dst.tmp"
mv "$dst.tmp" "$dst"
