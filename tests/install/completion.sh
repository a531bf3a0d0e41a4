#!/bin/bash
# install.completion: the bash completion of dspk-submit (without the
# bash-completion package, as on a minimal host) completes commands from
# `dspk-submit --help`, a command's options from `dspk-submit CMD --help`,
# reduce's functions, job's subcommands, and .npy file arguments only where a
# command takes arrays; --socket=PATH as readline splits it.
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
  unset COMP_LINE COMP_POINT
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
# complete_rl LINE EXPECTED...: the same with LINE split as readline splits
# it (COMP_WORDBREAKS: '=' and ':' are words of their own) and COMP_LINE.
complete_rl() {
  local line=$1 w="" c i; shift
  COMP_LINE=$line COMP_POINT=${#line} COMP_WORDS=()
  for ((i = 0; i < ${#line}; i++)); do
    c=${line:i:1}
    if [[ $c == " " ]]; then
      [[ -n $w ]] && COMP_WORDS+=("$w")
      w=""
    elif [[ $c == [=:] ]]; then
      [[ -n $w ]] && COMP_WORDS+=("$w")
      COMP_WORDS+=("$c")
      w=""
    else
      w+=$c
    fi
  done
  if [[ -n $w ]]; then COMP_WORDS+=("$w"); elif [[ $line == *' ' ]]; then COMP_WORDS+=(""); fi
  COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
  COMPREPLY=()
  _dspk_submit
  local got=" ${COMPREPLY[*]} " w
  for w in "$@"; do
    [[ $got == *" $w "* ]] || { echo "FAIL: '$line' (readline's words) offered [${COMPREPLY[*]}], not $w"; bad=1; }
  done
}
# complete_not LINE WORD...: no WORD is offered for LINE's last word.
complete_not() {
  local line=$1; shift
  unset COMP_LINE COMP_POINT
  read -r -a COMP_WORDS <<<"$line"
  [[ $line == *' ' ]] && COMP_WORDS+=("")
  COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
  COMPREPLY=()
  _dspk_submit
  local got=" ${COMPREPLY[*]} " w
  for w in "$@"; do
    [[ $got != *" $w "* ]] || { echo "FAIL: '$line' offered $w: [${COMPREPLY[*]}]"; bad=1; }
  done
}
# none: no candidate at all.
none() {
  [[ ${#COMPREPLY[@]} -eq 0 ]] || { echo "FAIL: $1 offered [${COMPREPLY[*]}]"; bad=1; }
}
cd "$tmp" || exit 1
: >a.npy; : >b.npy; : >notes.txt
complete_is "dspk-submit ge" gemm
complete_is "dspk-submit " ping devices gemm fft reduce cache help
[[ $(printf '%s\n' "${COMPREPLY[@]}" | sort | uniq -d) == "" ]] ||
  { echo "FAIL: 'dspk-submit ' offered one twice: [${COMPREPLY[*]}]"; bad=1; }
complete_is "dspk-submit gemm --tr" --trans-a --trans-b
complete_is "dspk-submit gemm -" --alpha --device --output
complete_is "dspk-submit reduce " sum max min mean
complete_is "dspk-submit cache " stats clear
# The function is the first operand as dspk-submit parses it: options (and
# their values) may come before it.
complete_is "dspk-submit reduce --axis 0 " sum max min mean
complete_is "dspk-submit reduce -a 0 --json " sum max min mean
complete_is "dspk-submit map --alpha 2 " add scale exp
complete_is "dspk-submit map -o y.npy " add scale exp
complete_rl "dspk-submit map --output=y.npy " add scale exp
complete_is "dspk-submit reduce --axis 0 sum " a.npy b.npy
complete_is "dspk-submit map -o y.npy scale " a.npy b.npy
# Probe 16 D5: an option that takes one value is not offered once given
# (the line would be refused: "option '--output' given twice"), however it
# was spelled; one whose values add up (reduce --axis, kernel -o) and
# flags are; map's --alpha only after scale and axpy (or before FN).
complete_not "dspk-submit gemm -o x.npy --o" --output
complete_not "dspk-submit gemm --output=x.npy -" --output -o
complete_not "dspk-submit gemm -ox.npy -" --output -o
complete_is "dspk-submit gemm -ox.npy -" --device --alpha --trans-a
complete_not "dspk-submit gemm --alpha 2 --al" --alpha
complete_not "dspk-submit gemm --al 2 -" --alpha
complete_not "dspk-submit ping -c 3 -" --count -c
complete_is "dspk-submit ping -c 3 -" --size -s --json
complete_not "dspk-submit ping -c3 -" --count -c
complete_not "dspk-submit trace -s 5 --s" --seconds
complete_not "dspk-submit map abs x.npy --device cpu:0 --d" --device
complete_not "dspk-submit map abs x.npy --al" --alpha
complete_not "dspk-submit map -o y.npy exp x.npy -" --alpha --output
complete_is "dspk-submit map scale x.npy --al" --alpha
complete_is "dspk-submit map axpy x.npy y.npy -" --alpha --output
complete_is "dspk-submit map --al" --alpha
complete_is "dspk-submit reduce sum x.npy --axis 0 --ax" --axis
complete_is "dspk-submit kernel k.cu -o a.npy --o" --output
complete_is "dspk-submit ping --json -" --json --count
complete_not "dspk-submit job register --job 1 --j" --job
complete_is "dspk-submit job register --job 1 --" --uid --devices
# The tables say so: one line an option, "values" for those that add up.
[[ $(dspk-submit --list-options reduce | grep -- '^--axis ') == "--axis -a values" &&
   $(dspk-submit --list-options kernel | grep -- '^--output ') == "--output -o values" &&
   $(dspk-submit --list-options gemm | grep -- '^--output ') == "--output -o value" &&
   -z $(dspk-submit --list-options map abs | grep -- '^--alpha') &&
   -n $(dspk-submit --list-options map scale | grep -- '^--alpha') ]] ||
  { echo "FAIL: --list-options: values, map FN"; bad=1; }
# --device is an option of the commands, not of dspk-submit: nothing before one.
for line in "dspk-submit --device " "dspk-submit -d " "dspk-submit -o "; do
  complete_is "$line"
  none "'$line'"
done
complete_is "dspk-submit gemm a" a.npy
complete_is "dspk-submit --socket /x fft " a.npy b.npy
complete_is "dspk-submit kernel --lang " cuda glsl
# Its short letter too, as the table gives it (probe 19 D3).
complete_is "dspk-submit kernel -l " cuda glsl
complete_is "dspk-submit kernel x.cu -e k -l " hip spirv
# A non-.npy file is not offered as an array.
complete_is "dspk-submit gemm n"
[[ ${#COMPREPLY[@]} -eq 0 ]] || { echo "FAIL: notes.txt offered as an array"; bad=1; }
# A file name with a space is one candidate.
: >"with space.npy"
complete_is "dspk-submit fft w"
[[ ${#COMPREPLY[@]} -eq 1 && ${COMPREPLY[0]} == "with space.npy" ]] ||
  { echo "FAIL: 'with space.npy' offered as [${COMPREPLY[*]}] (${#COMPREPLY[@]} words)"; bad=1; }
# --socket=PATH (split at '=' by readline) is the socket, not the command.
complete_rl "dspk-submit --socket=/x " ping gemm help
complete_rl "dspk-submit --socket=/x fft " a.npy b.npy
complete_rl "dspk-submit --socket=/x gemm a.npy -d " any
complete_rl "dspk-submit --socket=./" ./a.npy ./notes.txt
complete_rl "dspk-submit gemm --output=" a.npy
complete_is "dspk-submit --socket = /x " ping gemm help
complete_is "dspk-submit --socket = /x fft " a.npy b.npy
# An abbreviated long option is the option it names alone, as dspk-submit
# takes it (getopt_long): its value is completed as the option's (--dev
# completed file names, reduce --ax offered the functions; round 13).
for line in "dspk-submit gemm --dev " "dspk-submit gemm --devi " "dspk-submit gemm a.npy --de "; do
  complete_is "$line" any
  [[ " ${COMPREPLY[*]} " != *" a.npy "* ]] || { echo "FAIL: '$line' offered files"; bad=1; }
done
complete_rl "dspk-submit gemm --dev=" any
complete_is "dspk-submit map --out " a.npy
for line in "dspk-submit reduce --ax " "dspk-submit kernel k.comp --gr " "dspk-submit ping --c "; do
  complete_is "$line"
  none "'$line'"
done
complete_is "dspk-submit reduce --ax 0 " sum max min mean
complete_is "dspk-submit map --alp 2 " add scale exp
complete_is "dspk-submit reduce --ax 0 sum " a.npy b.npy
# A prefix of several options names none: no value to complete.
complete_is "dspk-submit gemm --t " a.npy b.npy
# Before COMMAND: --sock is --socket.
complete_is "dspk-submit --sock " a.npy notes.txt
complete_is "dspk-submit --sock /x " ping gemm help
complete_rl "dspk-submit --sock=/x " ping gemm help
complete_is "dspk-submit --sock /x fft " a.npy b.npy
complete_is "dspk-submit -S/x fft " a.npy b.npy
# Subcommands, and no files where a command takes none.
complete_is "dspk-submit job " register end
complete_is "dspk-submit help " gemm trace help  # help help (probe 21 D-5)
for line in "dspk-submit metrics " "dspk-submit top -n " "dspk-submit top " \
            "dspk-submit status " "dspk-submit job register " "dspk-submit cache clear " \
            "dspk-submit trace -s " "dspk-submit job register --uid "; do
  complete_is "$line"
  none "'$line'"
done
# Every option offered is one the command line then takes (from the
# parser's tables, dspk-submit --list-options): for every command and
# subcommand, each candidate of "-" is given to dspk-submit, which must not
# refuse it as an option (help --, cache --, cache stats --, job end --,
# metrics -- and devices -- offered options of other commands, or words of
# the help's prose; probe 15 D7), and none is offered twice.
mapfile -t cmds < <(dspk-submit --help | awk '/^Commands:/ {on = 1; next} on && /^  [a-z]/ {print $1}')
for line in "" "${cmds[@]}" "cache stats" "cache clear" "job register" "job end"; do
  complete_is "dspk-submit $line -"
  ((${#COMPREPLY[@]} > 0)) || { echo "FAIL: 'dspk-submit $line -' offered nothing"; bad=1; }
  offered=("${COMPREPLY[@]}")
  [[ $(printf '%s\n' "${offered[@]}" | sort | uniq -d) == "" ]] ||
    { echo "FAIL: 'dspk-submit $line -' offered one twice: [${offered[*]}]"; bad=1; }
  read -r -a lw <<<"$line"
  vals=" $(dspk-submit --list-options "${lw[@]}" | awk '$3 == "value" || $3 == "values" {print $1, $2}' | tr '\n' ' ') "
  for o in "${offered[@]}"; do
    args=("$o")
    [[ $vals == *" $o "* ]] && args+=(1)
    if [[ -z $line ]]; then
      err=$(dspk-submit "${args[@]}" ping 2>&1 >/dev/null </dev/null)
    else
      err=$(timeout 20 dspk-submit --socket /nonexistent/d.sock "${lw[@]}" "${args[@]}" 2>&1 >/dev/null </dev/null)
    fi
    [[ $err != *"does not apply"* && $err != *"unknown option"* && $err != *ambiguous* &&
       $err != *"takes no value"* && $err != *"needs an argument"* ]] ||
      { echo "FAIL: 'dspk-submit $line -' offered $o, refused: $err"; bad=1; }
  done
done
for line in "dspk-submit help --" "dspk-submit help ping --" "dspk-submit cache --"; do
  complete_is "$line" --help
  [[ ${COMPREPLY[*]} == --help ]] || { echo "FAIL: '$line' offered [${COMPREPLY[*]}]"; bad=1; }
done
for line in "dspk-submit metrics --m" "dspk-submit devices --d" "dspk-submit job end --u" \
            "dspk-submit cache stats --b"; do
  complete_is "$line"
  none "'$line'"
done
complete_is "dspk-submit cache clear --" --kernels --blobs --autotune --json --help
complete_is "dspk-submit job register --" --uid --devices --job
# trace writes JSON: -o offers any file.
complete_is "dspk-submit trace -o n" notes.txt
# A daemon that accepts the connection and never answers (a stopped
# process): --device gives up after DSPK_COMPLETION_TIMEOUT seconds and
# offers "any"; the shell is not held (the outer timeout only bounds a
# failure of this test).
coproc SILENT { exec python3 -c 'import socket, sys
s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(8)
print("ready", flush=True); sys.stdin.read()' "$tmp/silent.sock"; }
silent=$SILENT_PID ready=""
read -r ready <&"${SILENT[0]}"
if [[ $ready != ready ]]; then
  echo "FAIL: the silent listener did not start"; bad=1
else
  got=$(DSPK_COMPLETION_TIMEOUT=1 timeout 20 bash -c '. "$1/packaging/completion/dspk-submit"
    COMP_WORDS=(dspk-submit --socket "$2" gemm a.npy -d ""); COMP_CWORD=6
    _dspk_submit; echo "${COMPREPLY[*]}"' _ "$src" "$tmp/silent.sock")
  rc=$?
  [[ $rc -eq 0 && $got == any ]] ||
    { echo "FAIL: --device with a daemon that never answers: rc=$rc, offered [$got]"; bad=1; }
  # A value that is no positive number of seconds is the default (2 s):
  # timeout(1) takes 0 as no limit, which held the shell.
  # A positive number with an exponent is that many seconds (1e-1 waited
  # the default 2 s; probe 14 D4); one below a millisecond is the default.
  for tmo in 1e-1 .5E-1; do
    start=$(date +%s%N)
    got=$(DSPK_COMPLETION_TIMEOUT=$tmo timeout 20 bash -c '. "$1/packaging/completion/dspk-submit"
      COMP_WORDS=(dspk-submit --socket "$2" gemm a.npy -d ""); COMP_CWORD=6
      _dspk_submit; echo "${COMPREPLY[*]}"' _ "$src" "$tmp/silent.sock")
    rc=$? ms=$((($(date +%s%N) - start) / 1000000))
    [[ $rc -eq 0 && $got == any && $ms -lt 1500 ]] ||
      { echo "FAIL: DSPK_COMPLETION_TIMEOUT=$tmo: rc=$rc, offered [$got] after $ms ms (want < 1500)"; bad=1; }
  done
  for tmo in 0 0.0 -1 abc 1e-400 0.0004; do
    got=$(DSPK_COMPLETION_TIMEOUT=$tmo timeout 20 bash -c '. "$1/packaging/completion/dspk-submit"
      COMP_WORDS=(dspk-submit --socket "$2" gemm a.npy -d ""); COMP_CWORD=6
      _dspk_submit; echo "${COMPREPLY[*]}"' _ "$src" "$tmp/silent.sock")
    rc=$?
    [[ $rc -eq 0 && $got == any ]] ||
      { echo "FAIL: DSPK_COMPLETION_TIMEOUT=$tmo, a daemon that never answers: rc=$rc, offered [$got]"; bad=1; }
  done
fi
kill "$silent" 2>/dev/null
wait "$silent" 2>/dev/null
# --socket as typed (~, ~USER, $VAR, ${VAR}, quotes and backslashes, as
# readline hands the word over) is expanded as the shell will when the line
# runs: the device query goes to that socket.  A stand-in for
# dspk-submit lists a device only when asked on the expected path (and
# gives the real one's help, where the options are read).
printf '%s\n' '#!/bin/bash' \
  '[[ $2 == --help || $1 == --list-options ]] && exec dspk-submit "$@"' \
  '[[ $1 == --socket && $2 == "$WANT_SOCK" && $3 == devices ]] && echo "ok:1 cpu x"' \
  >"$tmp/fake-submit"
chmod +x "$tmp/fake-submit"
me=$(id -un)
# Abbreviated (--sock, --so=) and joined (-SPATH) spellings of --socket
# are the socket too (--sock was passed by: the default socket was asked).
for words in "--sock|/run/t/d.sock|gemm|a.npy|--dev|" "--so=/run/t/d.sock|gemm|--device|" \
             "-S/run/t/d.sock|gemm|-d|" "--socket|/run/t/d.sock|reduce|--dev|"; do
  IFS='|' read -r -a wl <<<"$words|"
  got=$(WANT_SOCK=/run/t/d.sock bash -c '. "$1/packaging/completion/dspk-submit"
    shift; COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
    _dspk_submit; echo "${COMPREPLY[*]}"' _ "$src" "$tmp/fake-submit" "${wl[@]}")
  [[ " $got " == *" ok:1 "* ]] ||
    { echo "FAIL: '$words': the socket not queried: offered [$got]"; bad=1; }
done
for pair in "~/d.sock|$HOME/d.sock" "~$me/d.sock|$(getent passwd "$me" | cut -d: -f6)/d.sock" \
            '$DSPK_T_DIR/d.sock|/run/t/d.sock' '${DSPK_T_DIR}x/d.sock|/run/tx/d.sock' \
            '/a$DSPK_T_NONE/d.sock|/a/d.sock' \
            '"$DSPK_T_DIR/d.sock"|/run/t/d.sock' "'/run/t/d.sock'|/run/t/d.sock" \
            '"${DSPK_T_DIR}"/s\ p.sock|/run/t/s p.sock' '/run/t/a\"b.sock|/run/t/a"b.sock' \
            "'/run/\$DSPK_T_DIR'|/run/\$DSPK_T_DIR" '"/run/\$x\\y\z"|/run/$x\y\z' \
            '~/"d s".sock|'"$HOME/d s.sock"'|~/d s.sock' '"~/d.sock"|~/d.sock'; do
  # typed|as bash expands it alone|as it expands it glued to --socket= or
  # -S (no tilde expansion there: probe 16 D6), when that differs.
  IFS='|' read -r typed want wantj <<<"$pair"
  [[ -z $wantj && $typed == "~"* ]] && wantj=$typed
  for form in split joined short; do
    if [[ $form == split ]]; then
      words=("$tmp/fake-submit" --socket "$typed" gemm a.npy -d "")
    elif [[ $form == joined ]]; then
      words=("$tmp/fake-submit" "--socket=$typed" gemm a.npy -d "")
    else
      words=("$tmp/fake-submit" "-S$typed" gemm a.npy -d "")
    fi
    [[ $form != split && -n $wantj ]] && want=$wantj || want=${pair#*|} want=${want%%|*}
    got=$(WANT_SOCK=$want DSPK_T_DIR=/run/t bash -c '. "$1/packaging/completion/dspk-submit"
      shift; COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
      _dspk_submit; echo "${COMPREPLY[*]}"' _ "$src" "${words[@]}")
    [[ " $got " == *" ok:1 "* ]] ||
      { echo "FAIL: --socket '$typed' ($form) not queried as $want: offered [$got]"; bad=1; }
  done
done
[ $bad -eq 0 ] && echo "completion: ok"
exit $bad
