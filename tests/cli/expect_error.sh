#!/usr/bin/env bash
# expect_error.sh REGEX CMD...: CMD must exit with status 1 and print REGEX on stderr.
set -u
regex=$1
shift
err=$("$@" 2>&1 >/dev/null)
rc=$?
if [ $rc -ne 1 ]; then
  echo "expected exit status 1, got $rc from: $*"
  echo "$err"
  exit 1
fi
if ! grep -qE "$regex" <<<"$err"; then
  echo "stderr of '$*' does not match /$regex/:"
  echo "$err"
  exit 1
fi
echo "ok: $err"
