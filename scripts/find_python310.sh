#!/usr/bin/env bash
# Prints the path of a working CPython 3.10 interpreter, or explains what to install and exits 1.
# TFX 1.16 declares Requires-Python <3.11, so no other version will do.
set -u
try() {
  local exe="$1"
  [ -n "$exe" ] || return 1
  out=$("$@" -c 'import sys; print(sys.executable if sys.version_info[:2] == (3, 10) else "")' 2>/dev/null) || return 1
  [ -n "$out" ] || return 1
  echo "$out"
  return 0
}
# 1. explicit override
if [ -n "${PYTHON310:-}" ] && try "$PYTHON310"; then exit 0; fi
# 2. pyenv's 3.10 (the pyenv shim for python3.10 fails unless a 3.10 is selected, so look in versions/)
if command -v pyenv >/dev/null 2>&1; then
  root=$(pyenv root 2>/dev/null)
  for exe in $(ls -d "$root"/versions/3.10.*/bin/python3.10 2>/dev/null | sort -V -r); do
    if try "$exe"; then exit 0; fi
  done
fi
# 3. a python3.10 on PATH that actually runs
if command -v python3.10 >/dev/null 2>&1 && try python3.10; then exit 0; fi
for exe in /usr/bin/python3.10 /usr/local/bin/python3.10; do
  if [ -x "$exe" ] && try "$exe"; then exit 0; fi
done
cat >&2 <<'MSG'
error: no working Python 3.10 interpreter was found.
TFX 1.16 needs CPython 3.10 (it declares Requires-Python <3.11). Install one, for example:
  pyenv install 3.10.13            (with pyenv)
  apt-get install python3.10 python3.10-venv   (Debian/Ubuntu with a 3.10 package)
or point PYTHON310=/path/to/python3.10 at an existing interpreter, then run make again.
MSG
exit 1
