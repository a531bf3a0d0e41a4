#!/bin/bash
# install.completion: the bash completion of dspk-submit (without the
# bash-completion package, as on a minimal host) completes commands from
# `dspk-submit --help`, a command's options from `dspk-submit CMD --help`,
# reduce's functions, and .npy file arguments.
# Usage: completion.sh SRC DSPK_SUBMIT
set -u
src=$1 submit=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The completion runs words[0]; put the built binary on PATH under its name.
ln -s "$(realpath "$submit")" "$tmp/dspk-submit"
PATH=$tmp:$PATH
# shellcheck source=/dev/null
. "$src/packaging/completion/dspk-submit"
bad=0
# complete LINE EXPECTED...: every EXPECTED word is offered for LINE's last word.
complete_is() {
  local line=$1; shift
  read -r -a COMP_WORDS <<<"$line"
  [[ $line == *' ' ]] && COMP_WORDS+=("")
  COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
  COMPREPLY=()
  _dspk_submit
  local got=" ${COMPREPLY[*]} " w
  for w in "$@"; do
    [[ $got == *" $w "* ]] || { echo "FAIL: '$line' offered [${COMPREPLY[*]}], not $w"; bad=1; }
  done
}
cd "$tmp" || exit 1
: >a.npy; : >b.npy; : >notes.txt
complete_is "dspk-submit ge" gemm
complete_is "dspk-submit " ping devices gemm fft reduce cache help
complete_is "dspk-submit gemm --tr" --trans-a --trans-b
complete_is "dspk-submit gemm -" --alpha --device --output
complete_is "dspk-submit reduce " sum max min mean
complete_is "dspk-submit cache " stats clear
complete_is "dspk-submit gemm a" a.npy
complete_is "dspk-submit --socket /x fft " a.npy b.npy
complete_is "dspk-submit kernel --lang " cuda glsl
# A non-.npy file is not offered as an array.
complete_is "dspk-submit gemm n"
[[ ${#COMPREPLY[@]} -eq 0 ]] || { echo "FAIL: notes.txt offered as an array"; bad=1; }
# A file name with a space is one candidate.
: >"with space.npy"
complete_is "dspk-submit fft w"
[[ ${#COMPREPLY[@]} -eq 1 && ${COMPREPLY[0]} == "with space.npy" ]] ||
  { echo "FAIL: 'with space.npy' offered as [${COMPREPLY[*]}] (${#COMPREPLY[@]} words)"; bad=1; }
[ $bad -eq 0 ] && echo "completion: ok"
exit $bad
