#!/bin/sh
# Run by the Dockerfile's builder stage: removes the debug sections from the shared objects in the wheels of
# a directory (what Debian's dh_strip does for its packages) and repacks each wheel it changed with
# `wheel pack`, which rewrites RECORD with the new hashes. Several dependencies ship their extension modules
# with DWARF debug info: the aerospike client's alone is 11 MB of which 9 are debug sections.
# Needs binutils (readelf, strip) and the `wheel` package. Usage: strip-wheels.sh DIR
set -eu
dir=$1
work=$(mktemp -d)
before=$(du -sk "$dir" | cut -f1)
for whl in "$dir"/*.whl; do
    # only the wheels that hold a shared object are unpacked (pyspark's alone is 400 MB of jars)
    python -c "import sys, zipfile; names = zipfile.ZipFile(sys.argv[1]).namelist(); \
sys.exit(not any('.so' in name.rsplit('/', 1)[-1] for name in names))" "$whl" || continue
    python -m wheel unpack --dest "$work" "$whl" >/dev/null
    tree=$(find "$work" -mindepth 1 -maxdepth 1 -type d)
    changed=
    find "$tree" -type f -name '*.so*' >"$work.list"
    while IFS= read -r so; do
        if readelf --section-headers "$so" 2>/dev/null | grep -q '\.debug_'; then
            strip --strip-debug "$so"
            changed=yes
        fi
    done <"$work.list"
    if [ -n "$changed" ]; then
        rm "$whl"
        python -m wheel pack --dest-dir "$dir" "$tree" >/dev/null
        echo "strip-wheels: $(basename "$whl")"
    fi
    rm -rf "$tree"
done
rmdir "$work"
rm -f "$work.list"
echo "strip-wheels: $dir from $((before / 1024)) to $(($(du -sk "$dir" | cut -f1) / 1024)) MiB"
