#!/bin/sh
# Fails when the manual, the code's comments or the test names tell how the project was made
# (work sessions, who measured what, issue numbers) instead of what the code is.
# Usage: no_project_history.sh SOURCE_DIR
set -u
root=${1:?usage: no_project_history.sh SOURCE_DIR}

# Built from pieces so that this file does not match its own pattern.
s=sess; i=ion; l=le; a=ad; h=help; u=iss
pattern="$s$i [0-9]+|this $s$i|the $l$a|${h}ers? (measured|found)|${u}ue [0-9]+"

# The pattern must catch a narrative line, or the check below proves nothing.
probe=$(mktemp) || exit 1
trap 'rm -f "$probe"' EXIT
printf 'Measured in %s%s 12 by %s%s.\n' "$s" "$i" "the $l" "$a" > "$probe"
if ! grep -qiE "$pattern" "$probe"; then
  echo "no_project_history.sh: the pattern misses a narrative line" >&2
  exit 1
fi

cd "$root" || exit 1
if grep -rniE "$pattern" docs src tests bench scripts README.md; then
  echo "the lines above tell the project's history: say what the code is and why" >&2
  exit 1
fi
echo "no project history in docs/, src/, tests/, bench/, scripts/, README.md"
