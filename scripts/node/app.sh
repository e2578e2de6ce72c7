#!/bin/sh
# The examples' app on the real-node tier (image localhost/confighash-test-app): reads its config
# as the real app would. It prints each file named in APP_FILES, exits 3 when one of them holds a
# line `broken: true` (a config the app cannot start with), and then serves until SIGTERM (or,
# with APP_ONCE set, as an init container, exits 0).
trap 'exit 0' TERM INT
for f in $APP_FILES; do
    echo "== $f"
    cat "$f" || exit 2
done
if [ -n "$APP_FILES" ] && grep -qs '^broken: true' $APP_FILES; then
    echo "broken config" >&2
    exit 3
fi
[ -z "$APP_ONCE" ] || exit 0
while :; do
    sleep 3600 &
    wait $!
done
