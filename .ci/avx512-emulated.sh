#!/usr/bin/env bash
# Runs kvslice-cpu's kernel and accuracy tests on an emulated AVX-512 CPU,
# so that the AVX-512 kernels are tested on machines without AVX-512.
#
# Neither qemu's TCG nor any machine this project builds on runs AVX-512;
# Bochs does (Debian builds it with EVEX support). Bochs emulates a whole
# PC, so the script boots Debian's cloud kernel from an ISO with an
# initramfs holding busybox and the two test binaries (linked statically),
# runs them with KVSLICE_REQUIRE_KERNELS naming the AVX-512 set with VNNI
# and VBMI (so a run that fell back fails), and reads their output from the
# emulated serial port. The emulated CPU is an Ice Lake, the first Bochs
# model with VNNI and VBMI; that set holds AVX-512's kernels but for the
# four-row int8 weighted sum, whose f32 form the other dtypes' share. About
# 7 minutes of emulation on one core, plus the build.
#
# Usage (repository root, Debian/Ubuntu, root or sudo for apt):
#   bash .ci/avx512-emulated.sh          # build, then boot and test
#   bash .ci/avx512-emulated.sh build    # only the build (uses every core)
#   bash .ci/avx512-emulated.sh run      # only the emulator (one core), after a build
# CI builds in the foreground and runs the emulator beside other
# single-core steps (Miri, loom).
# Work files go to target/avx512-emu (KVSLICE_EMU_DIR to change).
set -euo pipefail
cd "$(dirname "$0")/.."
phase=${1:-all}
case "$phase" in all | build | run) ;; *) echo "usage: $0 [build|run]" >&2; exit 2 ;; esac
work=${KVSLICE_EMU_DIR:-target/avx512-emu}
mkdir -p "$work"
work=$(cd "$work" && pwd)

# The build: packages, kernel, static test binaries, initramfs, ISO, bochsrc.
# (The two phases are not indented: their heredocs are written verbatim.)
if [ "$phase" != run ]; then
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
packages="bochs bochsbios vgabios isolinux syslinux-common xorriso cpio busybox-static"
missing=""
for p in $packages; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  $sudo apt-get update
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y $missing
fi

# Debian's current cloud kernel (few drivers: it boots in seconds of
# emulated time), unpacked without installing it.
if [ ! -f "$work/vmlinuz" ]; then
  pkg=$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image/ {print $2; exit}')
  [ -n "$pkg" ] || { echo "no linux-image-cloud-amd64 package found" >&2; exit 1; }
  (cd "$work" && rm -f linux-image-*.deb && apt-get download "$pkg" && dpkg-deb -x linux-image-*.deb kernel)
  cp "$work"/kernel/boot/vmlinuz-* "$work/vmlinuz"
fi

# The test binaries, static so that the initramfs needs no libc. With an
# explicit --target, RUSTFLAGS do not reach build scripts.
echo "building the kvslice-cpu test binaries (static)"
RUSTFLAGS="-C target-feature=+crt-static" cargo test --release -p kvslice-cpu --no-run \
  --target x86_64-unknown-linux-gnu --target-dir target/avx512-emu/cargo \
  --message-format=json > "$work/build.json"
# The library's unit tests (the kernel tests) and the accuracy suite; the
# corpus replay reads files from the source tree and stays out.
tests=$(grep -E '"name":"(kvslice_cpu|accuracy)"' "$work/build.json" \
  | grep -o '"executable":"[^"]*"' | cut -d'"' -f4)
[ "$(echo "$tests" | wc -l)" -eq 2 ] || { echo "expected two test binaries, got: $tests" >&2; exit 1; }

rm -rf "$work/root" "$work/iso"
mkdir -p "$work/root/bin" "$work/root/dev" "$work/root/proc" "$work/root/tests" "$work/iso/isolinux"
cp /bin/busybox "$work/root/bin/busybox"
for t in $tests; do cp "$t" "$work/root/tests/$(basename "$t" | sed 's/-[0-9a-f]*$//')"; done
$sudo mknod "$work/root/dev/console" c 5 1
cat > "$work/root/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox mount -t proc proc /proc
export KVSLICE_REQUIRE_KERNELS=avx512f+bw+vl+vnni+vbmi
for t in /tests/*; do
  echo "== running $t"
  $t --test-threads=1 --nocapture
  echo "== exit $t $?"
done
/bin/busybox sleep 1
/bin/busybox poweroff -f
EOF
chmod +x "$work/root/init"
(cd "$work/root" && find . | cpio -o -H newc 2>/dev/null | gzip -1 > "$work/iso/isolinux/initrd.gz")
cp "$work/vmlinuz" "$work/iso/isolinux/vmlinuz"
cp /usr/lib/ISOLINUX/isolinux.bin /usr/lib/syslinux/modules/bios/ldlinux.c32 "$work/iso/isolinux/"
# Bochs 2.7's XSAVE leaves are not what Linux checks them against: its
# PKRU leaf is empty and its compacted (XSAVES) size is the standard one,
# and Linux then turns XSAVE (and with it AVX) off. Clearing PKU/OSPKE
# (515, 516) and XSAVEC/XSAVES (321, 323) leaves a consistent standard
# XSAVE with the AVX-512 state. Ice Lake's fast short `rep movsb` (FSRM),
# which the kernel then uses for its small copies, stalls the boot under
# Bochs 2.7 (it stops after "LSM: Security Framework initializing"), so it
# is cleared too.
cat > "$work/iso/isolinux/isolinux.cfg" <<'EOF'
DEFAULT linux
PROMPT 0
TIMEOUT 0
LABEL linux
  KERNEL vmlinuz
  APPEND initrd=initrd.gz console=ttyS0,115200 quiet panic=-1 rdinit=/init nokaslr mitigations=off clearcpuid=515,516,321,323,fsrm
EOF
xorriso -as mkisofs -quiet -o "$work/boot.iso" -b isolinux/isolinux.bin -c isolinux/boot.cat \
  -no-emul-boot -boot-load-size 4 -boot-info-table "$work/iso"

cat > "$work/bochsrc" <<EOF
megs: 1024
cpu: model=corei7_icelake_u, count=1, ips=200000000, reset_on_triple_fault=0
romimage: file=/usr/share/bochs/BIOS-bochs-latest
vgaromimage: file=/usr/share/bochs/VGABIOS-lgpl-latest
ata0-master: type=cdrom, path=$work/boot.iso, status=inserted
boot: cdrom
display_library: rfb, options="timeout=0"
com1: enabled=1, mode=file, dev=$work/serial.txt
log: $work/bochs.log
panic: action=fatal
error: action=report
info: action=ignore
clock: sync=none, time0=local
sound: driver=dummy
speaker: enabled=0
EOF
# This Debian build has Bochs's debugger: `c` starts the machine.
printf 'c\nquit\n' > "$work/debugger.rc"
rm -f "$work/serial.txt"
fi

# The emulator run: one core for several minutes.
if [ "$phase" != build ]; then
[ -f "$work/bochsrc" ] || { echo "no emulator build in $work: run '$0 build' first" >&2; exit 1; }
echo "booting the emulated Ice Lake (AVX-512 with VNNI and VBMI) and running the tests"
start=$SECONDS
# --foreground keeps bochs in this process group, so that stopping the
# group (as CI does when it runs this in the background) stops it too.
timeout --foreground "${KVSLICE_EMU_TIMEOUT:-1800}" bochs -q -f "$work/bochsrc" -rc "$work/debugger.rc" \
  < /dev/null > "$work/bochs.out" 2>&1 || true
echo "emulator ran $((SECONDS - start)) s"
# The guest's console writes CRLF line ends.
touch "$work/serial.txt"
serial="$work/serial.log"
tr -d '\r' < "$work/serial.txt" > "$serial"
grep -a -E "^(kernels:|KVSLICE|test |test result|== )|panicked|FAILED" "$serial" || true
# Pass only if both binaries ran to the end and exited 0.
ok=$(grep -a -c -E "^== exit /tests/[a-z_]+ 0$" "$serial" || true)
if [ "$ok" -ne 2 ]; then
  echo "AVX-512 emulated tests FAILED ($ok of 2 binaries passed); serial log: $serial" >&2
  tail -n 40 "$serial" >&2
  exit 1
fi
echo "AVX-512 emulated tests passed"
fi
