#!/usr/bin/env bash
# Builds a local stand-in for the official base image, python:3.11-slim-<release>, from Debian packages,
# for machines that cannot reach a container registry (the Dockerfile's default base is pinned by digest
# and needs one):
#
#   deploy/image/stand-in-base.sh [bookworm] [trixie]      # default: both
#   podman build --build-arg BASE_IMAGE=localhost/python:3.11-slim-trixie --target ignismq .
#
# What it makes: `mmdebstrap --variant=minbase` of that Debian release (the official slim images start from
# debian:<release>-slim, itself a minbase), with the same dpkg path-excludes as the slim images (no
# /usr/share/man, doc, info or locale: so it shows the same OpenJDK post-install clash the real base does),
# ca-certificates, netbase and tzdata as the official image adds them, and the same Python layout:
# python3, python3.11, python and pip in /usr/local/bin, pip installed into /usr/local and installing there,
# no EXTERNALLY-MANAGED marker.
#
# How it differs from the official image (docs/kubernetes/install.md says the same):
# - its Python is Debian's python3 package, not CPython built from source into /usr/local: on bookworm that
#   is CPython 3.11 (3.11.2 plus Debian's patches); on trixie Debian ships only 3.13, so there
#   /usr/local/bin/python3.11 is a link to python3.13 and the image's wheels are cp313 ones;
# - the Python files live in /usr/lib/python3.X (+ /usr/local/lib/python3.X/dist-packages for what pip
#   installs), not /usr/local/lib/python3.11/site-packages;
# - its pip is the version Debian bundles for ensurepip (bookworm 23.0.1, trixie 25.1), not the one the
#   official image pins, and it has no setuptools or wheel in /usr/local;
# - its digest is its own: build with --build-arg BASE_IMAGE=localhost/python:3.11-slim-<release>.
#
# Needs root (or mmdebstrap's unshare mode), mmdebstrap and podman (Debian: apt-get install -y podman
# mmdebstrap) and a Debian mirror (MIRROR, default http://deb.debian.org).
set -euo pipefail

MIRROR=${MIRROR:-http://deb.debian.org}
RELEASES=("$@")
[ ${#RELEASES[@]} -gt 0 ] || RELEASES=(bookworm trixie)

for tool in mmdebstrap podman; do
    command -v "$tool" >/dev/null || { echo "stand-in-base: $tool is not installed (apt-get install -y $tool)" >&2; exit 1; }
done

# The slim images' /etc/dpkg/dpkg.cfg.d/docker: documentation, manual pages and translations are never unpacked.
EXCLUDES=(
    --dpkgopt='path-exclude=/usr/share/man/*'
    --dpkgopt='path-exclude=/usr/share/groff/*'
    --dpkgopt='path-exclude=/usr/share/info/*'
    --dpkgopt='path-exclude=/usr/share/lintian/*'
    --dpkgopt='path-exclude=/usr/share/linda/*'
    --dpkgopt='path-exclude=/var/cache/man/*'
    --dpkgopt='path-exclude=/usr/share/locale/*'
    --dpkgopt='path-exclude=/usr/share/doc/*'
    --dpkgopt='path-include=/usr/share/doc/*/copyright'
)

# The official image's Python layout, made of Debian's python3: the names in /usr/local/bin, and pip
# installed into /usr/local from the wheel Debian ships for ensurepip (python3-pip-whl; Debian's ensurepip
# refuses the system Python), not byte-compiled, as the official image installs it: so pip may upgrade or
# replace what it installed, which it may not do to Debian's python3-* packages. Free to install there: the
# official interpreter carries no EXTERNALLY-MANAGED marker either.
# shellcheck disable=SC2016  # expanded by the shell in the chroot, not by this one
PYTHON_LAYOUT='set -eu
py=$(readlink -f /usr/bin/python3)
for name in python3.11 python3 python; do ln -sf "$py" "/usr/local/bin/$name"; done
rm -f /usr/lib/python3*/EXTERNALLY-MANAGED
set -- /usr/share/python-wheels/pip-*.whl
"$py" "$1/pip" install --quiet --no-index --no-compile --disable-pip-version-check --root-user-action=ignore "$1"
[ -e /usr/local/bin/pip3.11 ] || ln -s pip3 /usr/local/bin/pip3.11
"$py" --version; /usr/local/bin/pip --version'

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for release in "${RELEASES[@]}"; do
    case "$release" in
        bookworm|trixie) ;;
        *) echo "stand-in-base: $release: only bookworm and trixie are made" >&2; exit 2 ;;
    esac
    image="localhost/python:3.11-slim-$release"
    echo "== stand-in base $image: mmdebstrap $release from $MIRROR"
    # maybe-merged-usr: a merged /usr without the usrmerge package (which would pull perl into bookworm)
    mmdebstrap --variant=minbase --quiet --hook-dir=/usr/share/mmdebstrap/hooks/maybe-merged-usr \
        --aptopt='Acquire::Languages "none"' \
        --aptopt='APT::Install-Recommends "false"' \
        "${EXCLUDES[@]}" \
        --include=ca-certificates,netbase,tzdata,python3,python3-venv \
        --customize-hook="chroot \"\$1\" sh -c '$PYTHON_LAYOUT'" \
        "$release" "$work/$release.tar" \
        "deb $MIRROR/debian $release main" \
        "deb $MIRROR/debian $release-updates main" \
        "deb $MIRROR/debian-security $release-security main"
    version=$(tar -xOf "$work/$release.tar" ./etc/debian_version)
    podman import --quiet \
        --change 'ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["python3"]' \
        --change "LABEL org.opencontainers.image.title=\"stand-in for python:3.11-slim-$release\"" \
        --change "LABEL org.opencontainers.image.description=\"mmdebstrap of Debian $version with Debian's python3 in the official image's layout (deploy/image/stand-in-base.sh)\"" \
        --message "deploy/image/stand-in-base.sh $release" \
        "$work/$release.tar" "$image" >/dev/null
    rm -f "$work/$release.tar"
    echo "== $image: Debian $version, $(podman image inspect --format '{{.Size}}' "$image" | numfmt --to=si)B"
done
