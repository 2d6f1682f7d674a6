// Package image tests scripts/build-image.sh: the archive it writes reads back with
// go-containerregistry (tools/image check: manifests, configs and layer digests valid),
// names the image rampart.io/rampart:<version> and :latest, and its binaries run from the
// unpacked file system alone (a chroot).
package image
