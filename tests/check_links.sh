#!/usr/bin/env bash
# Fails when the repository points at documents a clone does not have:
#  1. any tracked text file naming a folder beside the repository (`../shared`), a research note
#     (`research/NAME.md`), or a top-level DESIGN.md / STYLE.md (the design and style live in docs/);
#  2. a Markdown link `[text](path)` whose relative target does not exist (http(s), mailto and
#     `#anchor` links are skipped; `#anchor` is stripped from a path);
#  3. a Markdown file naming in backticks a `.md` path that exists neither from the repository
#     root nor from the file's folder.
set -euo pipefail
root=${1:?usage: check_links.sh SOURCE_ROOT}
cd "$root"
self=tests/check_links.sh
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files)
else
  mapfile -t files < <(find . -path ./build -prune -o -path ./.git -prune -o -type f -print |
    sed 's|^\./||')
fi

bad=()
# Patterns are assembled so this file does not match itself, and is skipped anyway.
dotdot='\.\./'"shared"
research='research/[A-Za-z0-9_.-]*\.md'
toplevel='(^|[^/A-Za-z0-9_.-])(DESIGN|STYLE)\.md'
for f in "${files[@]}"; do
  [ -f "$f" ] || continue
  [ "$f" = "$self" ] && continue
  grep -Iq . "$f" 2>/dev/null || continue  # binary or empty
  while IFS= read -r hit; do
    bad+=("$f:$hit (points outside the repository)")
  done < <(grep -n -E "$dotdot|$research|$toplevel" "$f" | cut -c1-160 || true)
done

for f in "${files[@]}"; do
  case "$f" in *.md) ;; *) continue ;; esac
  [ -f "$f" ] || continue
  dir=$(dirname "$f")
  # [text](target): relative targets only.
  while IFS= read -r target; do
    target=${target#*](}
    target=${target%)}
    target=${target%% *}  # drop a "title"
    case "$target" in
      http://* | https://* | mailto:* | '#'* | '') continue ;;
    esac
    path=${target%%#*}
    [ -n "$path" ] || continue
    if [ "${path#/}" != "$path" ]; then
      [ -e ".$path" ] || bad+=("$f: link to missing $target")
    else
      [ -e "$dir/$path" ] || bad+=("$f: link to missing $target")
    fi
  done < <(grep -o -E '\]\([^)]+\)' "$f" || true)
  # `some/path.md` in backticks: must exist from the root or from the file's folder.
  while IFS= read -r name; do
    name=${name#\`}
    name=${name%\`}
    [ -e "$name" ] || [ -e "$dir/$name" ] || bad+=("$f: names missing \`$name\`")
  done < <(grep -o -E '`[A-Za-z0-9_./-]+\.md`' "$f" || true)
done

if [ ${#bad[@]} -ne 0 ]; then
  echo "references to documents a clone does not have:"
  printf '  %s\n' "${bad[@]}"
  exit 1
fi
echo "${#files[@]} files checked"
