# Resumable steps for recipe scripts (sourced; scripts/reproduce_ende.sh). Needs $runs.
#
#   step NAME CMD...   runs CMD unless NAME finished before, and records its wall time.
#
# A step is done only when its command exited 0: then, and only then, an empty marker
# $runs/.done/<NAME> is created by an atomic rename. A step killed at any point, even after its
# outputs began to appear, has no marker and runs again (the jobs it calls resume themselves).
# Wall time per finished step is appended to $runs/times.tsv (one short line per write).

step_marker() {  # step_marker NAME: the marker file of a step
  printf '%s/.done/%s' "$runs" "$(printf '%s' "$1" | tr -c 'A-Za-z0-9_.=-' '_')"
}

step() {
  local name=$1 marker
  shift
  marker=$(step_marker "$name")
  if [[ -e "$marker" ]]; then
    echo "== $name: done"
    return
  fi
  echo "== $name"
  local start=$SECONDS
  "$@"
  mkdir -p "$runs/.done"
  local tmp
  tmp=$(mktemp "$runs/.done/.tmp.XXXXXX")
  printf '%s\t%s\n' "$name" "$((SECONDS - start))" >"$tmp"
  mv -f "$tmp" "$marker"
  printf '%s\t%s\n' "$name" "$((SECONDS - start))" >>"$runs/times.tsv"
}
