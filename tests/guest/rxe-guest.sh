#!/usr/bin/env bash
# rxe-guest.sh - run a host-built command inside a throwaway QEMU guest that
# has real soft-RoCE (rdma_rxe), because the host kernel has no RDMA support.
#
#   rxe-guest.sh --cache DIR [--share DIR]... [--timeout SEC] [--smp N]
#                [--mem MB] [--verbose] [--link MODE:PORT:IP] [--provider rxe|siw]
#                -- COMMAND [ARGS...]
#
# The guest boots Debian's current stock kernel (downloaded once into the
# cache) with a tiny busybox initramfs, uses the host's / (read-only, over 9p)
# as its root filesystem, creates rxe0 on eth0 (192.168.77.1/24) and runs
# COMMAND there (--provider siw: soft-iWARP siw0 instead, built once out of tree,
# since Debian's kernel has no siw.ko). COMMAND's stdout+stderr come out on our stdout and we exit
# with its status. Harness failures (no boot, no rxe0, timeout) exit 125.
# See tests/guest/README.md.
set -euo pipefail

readonly GUEST_IP=192.168.77.1
readonly GUEST_PREFIX=24
readonly HARNESS_FAIL=125
# Guest PATH for COMMAND (and for the host tools init runs inside the chroot).
readonly GUEST_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# Modules loaded in the guest, in this order (dependencies are resolved on the
# host with modprobe --show-depends and inserted before each entry).
# crc32_generic is listed before rdma_rxe on purpose: rxe needs the "crc32"
# crypto algorithm but does not declare the dependency, and without it
# `rdma link add` fails ("failed to init crc32 algorithm").
readonly RXE_MODULES="virtio_pci virtio_net 9pnet_virtio 9p crc32_generic rdma_rxe ib_uverbs rdma_ucm"
# siw (built by build_siw below) needs crc32c through libcrc32c, which asks the crypto
# layer for it at load time: crc32c_generic must be there first.
readonly SIW_MODULES="virtio_pci virtio_net 9pnet_virtio 9p crc32c_generic libcrc32c siw ib_uverbs rdma_ucm"
# Loaded if present but never configured (later tests use them); missing ones
# are skipped silently.
readonly OPTIONAL_MODULES="crc32c_generic dummy veth sch_netem"

prog=${0##*/}
msg() { printf '%s: %s\n' "$prog" "$*" >&2; }
die() { msg "error: $*"; exit "$HARNESS_FAIL"; }

usage() {
	cat <<EOF
usage: $prog --cache DIR [--share DIR]... [--timeout SEC] [--smp N] [--mem MB]
       [--verbose] [--link listen|connect:PORT:IP] [--provider rxe|siw] -- COMMAND [ARGS...]

Runs COMMAND (argv preserved, via /bin/sh -c) as root in a QEMU guest whose
root is the host's / (read-only) with fresh tmpfs on /tmp /run /var/tmp and a
soft-RoCE device rxe0 (or soft-iWARP siw0) on eth0 = $GUEST_IP/$GUEST_PREFIX.

  --cache DIR    kernel/modules/initramfs cache (created; first run downloads)
  --share DIR    host dir visible read-write at the same path (repeatable)
  --timeout SEC  kill the guest after SEC seconds (default 600)
  --smp N        guest vCPUs (default 2)
  --mem MB       guest memory (default 1024)
  --verbose      show guest boot messages on stderr
  --link listen|connect:PORT:IP
                 a second NIC (eth1, address IP/24, soft-RoCE device rxe1) on a
                 QEMU socket network shared with another guest started with the
                 other mode and the same PORT (127.0.0.1 only): two hosts
  --provider P   rxe (default): soft-RoCE rxe0; siw: soft-iWARP siw0 (siw.ko is
                 built on the first run from Debian's linux-source and headers
                 of the guest kernel, and cached)

COMMAND gets RDMX_GUEST_IP, RDMX_RDMA_DEVICE, HOME=/tmp, a standard PATH and
any RDMX_* variables of the caller. Exit status: COMMAND's, or $HARNESS_FAIL if
the guest could not run it.
EOF
}

# ---------------------------------------------------------------- arguments
cache=
shares=()
timeout_s=600
smp=2
mem=1024
verbose=${RDMX_GUEST_VERBOSE:-0}
link=
provider=rxe
while (($#)); do
	case $1 in
	--cache) (($# >= 2)) || die "--cache needs a value"; cache=$2; shift 2 ;;
	--share) (($# >= 2)) || die "--share needs a value"; shares+=("$2"); shift 2 ;;
	--timeout) (($# >= 2)) || die "--timeout needs a value"; timeout_s=$2; shift 2 ;;
	--smp) (($# >= 2)) || die "--smp needs a value"; smp=$2; shift 2 ;;
	--mem) (($# >= 2)) || die "--mem needs a value"; mem=$2; shift 2 ;;
	--verbose) verbose=1; shift ;;
	--link) (($# >= 2)) || die "--link needs a value"; link=$2; shift 2 ;;
	--provider) (($# >= 2)) || die "--provider needs a value"; provider=$2; shift 2 ;;
	-h | --help) usage; exit 0 ;;
	--) shift; break ;;
	*) usage >&2; die "unknown argument: $1" ;;
	esac
done
(($#)) || { usage >&2; die "no COMMAND given"; }
[[ -n $cache ]] || die "--cache DIR is required"
[[ $timeout_s =~ ^[1-9][0-9]*$ ]] || die "--timeout must be a positive integer"
[[ $smp =~ ^[1-9][0-9]*$ ]] || die "--smp must be a positive integer"
[[ $mem =~ ^[1-9][0-9]*$ ]] || die "--mem must be a positive integer"
[[ $verbose == 1 ]] || verbose=0
case $provider in
rxe) RDMA_DEV=rxe0 REQUIRED_MODULES=$RXE_MODULES ;;
siw) RDMA_DEV=siw0 REQUIRED_MODULES=$SIW_MODULES ;;
*) die "--provider must be rxe or siw" ;;
esac
readonly RDMA_DEV REQUIRED_MODULES
# --link listen|connect:PORT:IP joins this guest to another one: a second NIC (eth1)
# on a QEMU socket network (the two QEMUs talk over 127.0.0.1:PORT, nothing else), with
# address IP/24 and its own soft-RoCE device rxe1. Two guests = two kernels = two hosts.
link_ip= link_qemu=()
if [[ -n $link ]]; then
	[[ $provider == rxe ]] || die "--link needs --provider rxe (its second device is rxe1)"
	[[ $link =~ ^(listen|connect):([0-9]+):([0-9]+\.[0-9]+\.[0-9]+\.([0-9]+))$ ]] ||
		die "--link must be listen:PORT:IP or connect:PORT:IP"
	link_ip=${BASH_REMATCH[3]}
	# Each guest's eth1 needs its own MAC: QEMU's default is the same for every NIC.
	link_qemu=(-netdev "socket,id=n1,${BASH_REMATCH[1]}=127.0.0.1:${BASH_REMATCH[2]}"
		-device "virtio-net-pci,netdev=n1,mac=52:54:00:4d:01:$(printf %02x "${BASH_REMATCH[4]}")")
fi

for tool in qemu-system-x86_64 busybox apt-get apt-cache dpkg depmod modprobe flock timeout; do
	command -v "$tool" >/dev/null || die "required host tool '$tool' not found"
done

# POSIX-sh single quoting (the guest side runs dash/busybox ash, so no $'..').
shq() { printf "'%s'" "${1//\'/\'\\\'\'}"; }

# ---------------------------------------------------------------- the cache
mkdir -p "$cache" || die "cannot create cache dir $cache"
cache=$(cd "$cache" && pwd -P)

# Everything written into the cache happens under this lock: meson runs tests
# in parallel and several of us may find an empty cache at the same time.
exec {lock_fd}>"$cache/.lock"
flock -w "$timeout_s" "$lock_fd" || die "cache $cache still locked by another run after ${timeout_s}s"

# The stock kernel image package that linux-image-amd64 currently points at.
# apt-cache reads local lists only (no network), but takes ~1 s, so its
# answer is remembered until the apt lists change (apt-get update).
lists_key=$(find /var/lib/apt/lists /etc/apt -maxdepth 2 -printf '%p %s %T@\n' 2>/dev/null |
	sort | sha256sum | cut -d' ' -f1)
kpkg=
if [[ $(cat "$cache/kpkg.key" 2>/dev/null) == "$lists_key" ]]; then
	kpkg=$(cat "$cache/kpkg" 2>/dev/null) || true
fi
if [[ -z $kpkg ]]; then
	kpkg=$(apt-cache depends linux-image-amd64 2>/dev/null |
		awk '$1 ~ /^\|?Depends:$/ && $2 ~ /^linux-image-/ { print $2; exit }') || true
	if [[ -n $kpkg ]]; then
		printf '%s\n' "$kpkg" >"$cache/kpkg"
		printf '%s\n' "$lists_key" >"$cache/kpkg.key"
	fi
fi
if [[ -z $kpkg ]]; then
	# No apt metadata: fall back to a kernel we already have, if exactly one.
	mapfile -t have < <(find "$cache" -mindepth 2 -maxdepth 2 -name .extracted -printf '%h\n' 2>/dev/null)
	((${#have[@]} == 1)) || die "cannot resolve linux-image-amd64 with apt-cache (run apt-get update?)"
	kpkg=linux-image-${have[0]##*/}
	msg "warning: apt-cache gave no kernel package, using cached $kpkg"
fi
kver=${kpkg#linux-image-}
kdir=$cache/$kver
kroot=$kdir/root

# 1. the .deb (apt-get download keeps the real file name; any version of this
#    package name is fine - the ABI is in the name).
shopt -s nullglob
debs=("$cache"/pkg/"${kpkg}"_*.deb)
shopt -u nullglob
if ((${#debs[@]} == 0)); then
	msg "downloading $kpkg (first run only)"
	mkdir -p "$cache/pkg"
	# apt-get prints progress on stdout: keep our stdout for COMMAND only.
	# (as root apt warns that its _apt sandbox user cannot write here)
	sandbox=()
	((EUID)) || sandbox=(-o APT::Sandbox::User=root)
	(cd "$cache/pkg" && timeout "$timeout_s" apt-get download -q "${sandbox[@]}" "$kpkg") >&2 ||
		die "apt-get download $kpkg failed"
	debs=("$cache"/pkg/"${kpkg}"_*.deb)
fi
deb=${debs[-1]}

# 2. unpack + depmod (the package ships no modules.dep). Done in a temp dir
#    and renamed so a crash never leaves a half-unpacked tree marked done.
if [[ ! -e $kdir/.extracted || ! -d $kroot/lib/modules/$kver ]]; then
	msg "unpacking $kpkg"
	rm -rf "$kdir"
	mkdir -p "$kdir.tmp"
	dpkg -x "$deb" "$kdir.tmp/root" || die "dpkg -x $deb failed"
	[[ -d $kdir.tmp/root/lib/modules/$kver ]] || die "$deb has no /lib/modules/$kver"
	depmod -b "$kdir.tmp/root" "$kver" || die "depmod failed"
	touch "$kdir.tmp/.extracted"
	mv "$kdir.tmp" "$kdir"
fi
bzimage=$kroot/boot/vmlinuz-$kver
[[ -r $bzimage ]] || die "no kernel image $bzimage in cache (delete $kdir)"

# 3. optional uncompressed vmlinux: QEMU can boot the ELF directly through its
#    PVH entry point, skipping the in-guest decompression (~4 s under TCG).
#    The payload location comes from the bzImage setup header (boot protocol
#    >= 2.08): setup_sects @0x1f1, payload_offset/length @0x248/0x24c.
extract_vmlinux() {
	local img=$1 out=$2 sects off len start magic
	sects=$(od -An -tu1 -j $((0x1f1)) -N1 "$img" | tr -d ' ')
	read -r off len < <(od -An -tu4 -j $((0x248)) -N8 "$img")
	[[ -n $sects && -n $off && -n $len ]] || return 1
	start=$(((sects + 1) * 512 + off))
	magic=$(od -An -tx1 -j "$start" -N4 "$img" | tr -d ' ')
	local -a dec
	case $magic in
	fd377a58) dec=(xz -dc --single-stream) ;;
	1f8b*) dec=(gzip -dc) ;;
	28b52ffd) dec=(zstd -dc) ;;
	*) return 1 ;;
	esac
	command -v "${dec[0]}" >/dev/null || return 1
	tail -c +$((start + 1)) "$img" | head -c "$len" | "${dec[@]}" >"$out" 2>/dev/null || true
	# Must be an ELF with the Xen PVH note (XEN_ELFNOTE_PHYS32_ENTRY), or QEMU
	# cannot boot it; otherwise we stay with the bzImage.
	[[ $(od -An -c -N4 "$out" | tr -d ' ') == 177ELF ]] || return 1
	grep -q 'CONFIG_PVH=y' "$kroot/boot/config-$kver" 2>/dev/null || return 1
}
vmlinux=$kdir/vmlinux
if [[ ! -e $vmlinux && ! -e $kdir/vmlinux.bad ]]; then
	if extract_vmlinux "$bzimage" "$vmlinux.tmp"; then
		mv "$vmlinux.tmp" "$vmlinux"
	else
		rm -f "$vmlinux.tmp"
		touch "$kdir/vmlinux.bad"
	fi
fi

# 3b. --provider siw: Debian builds no siw.ko (CONFIG_RDMA_SIW is off), so build it
#     out of tree, once, from the linux-source package of the guest kernel's exact
#     version and its headers package, and keep it with the kernel (updates/siw.ko,
#     found by depmod like any other module). Needs make and gcc; the headers package
#     is installed with apt-get when missing (root, or sudo).
build_siw() {
	local ko=$kdir/siw.ko dst=$kroot/lib/modules/$kver/updates/siw.ko
	if [[ ! -s $ko ]]; then
		local ver series hdr hpkg src sdeb sudo=() sandbox=()
		ver=$(dpkg-deb -f "$deb" Version) || die "cannot read the version of $deb"
		[[ $kver =~ ^([0-9]+\.[0-9]+)\. ]] || die "cannot tell the kernel series of $kver"
		series=${BASH_REMATCH[1]}
		hpkg=linux-headers-$kver
		hdr=/usr/src/$hpkg
		((EUID)) && sudo=(sudo)
		((EUID)) || sandbox=(-o APT::Sandbox::User=root)
		command -v make >/dev/null && command -v gcc >/dev/null || {
			msg "installing make gcc (to build siw.ko; first run only)"
			DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends make gcc >&2 ||
				die "apt-get install make gcc failed"
		}
		# The headers must be those of this very kernel build: same ABI name and version.
		if [[ $(dpkg-query -W -f '${Status} ${Version}' "$hpkg" 2>/dev/null) != "install ok installed $ver" ]]; then
			msg "installing $hpkg=$ver (to build siw.ko; first run only)"
			DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends \
				"$hpkg=$ver" >&2 ||
				die "apt-get install $hpkg=$ver failed (apt-get update? a newer kernel: rm -rf $cache)"
		fi
		[[ -e $hdr/Makefile ]] || die "$hpkg has no $hdr/Makefile"
		src=$kdir/siw-src
		if [[ ! -e $src/.extracted ]]; then
			sdeb=$cache/pkg/linux-source-${series}_${ver}_all.deb
			if [[ ! -s $sdeb ]]; then
				msg "downloading linux-source-$series=$ver (first siw run only)"
				(cd "$cache/pkg" && timeout "$timeout_s" apt-get download -q "${sandbox[@]}" \
					"linux-source-$series=$ver") >&2 || die "apt-get download linux-source-$series=$ver failed"
			fi
			msg "unpacking drivers/infiniband/sw/siw from linux-source-$series"
			rm -rf "$src" "$src.tmp"
			mkdir -p "$src.tmp"
			dpkg-deb --fsys-tarfile "$sdeb" | tar -xO "./usr/src/linux-source-$series.tar.xz" |
				xz -dc | tar -x -C "$src.tmp" --strip-components=5 \
					"linux-source-$series/drivers/infiniband/sw/siw" ||
				die "cannot unpack the siw sources from $sdeb"
			[[ -e $src.tmp/Makefile ]] || die "no siw Makefile in $sdeb"
			touch "$src.tmp/.extracted"
			mv "$src.tmp" "$src"
			# The module is what we keep; the 140 MB source package can go.
			rm -f "$sdeb"
		fi
		msg "building siw.ko for $kver"
		make -s -C "$hdr" M="$src" CONFIG_RDMA_SIW=m modules >"$kdir/siw-build.log" 2>&1 ||
			{ tail -n 30 "$kdir/siw-build.log" >&2; die "building siw.ko failed (log: $kdir/siw-build.log)"; }
		# Without its debug info: a third of the size, and the initramfs unpacks faster.
		strip --strip-debug -o "$ko.tmp" "$src/siw.ko" && mv "$ko.tmp" "$ko" || die "cannot store siw.ko"
	fi
	if ! cmp -s "$ko" "$dst"; then
		mkdir -p "${dst%/*}"
		cp "$ko" "$dst" || die "cannot install siw.ko into $kroot"
		depmod -b "$kroot" "$kver" || die "depmod failed"
	fi
}
[[ $provider == siw ]] && build_siw

# 4. the initramfs: static busybox, the needed modules (uncompressed, so
#    busybox insmod can load them), an ordered load list and /init below.
#    Rebuilt when any input changes (key = hash of all of them).
read -r -d '' GUEST_INIT <<'INIT_EOF' || true
#!/bin/busybox sh
# PID 1 of the rxe guest (busybox ash, POSIX sh). Mounts the host root,
# loads modules, brings up eth0 + rxe0, runs the command in a chroot and
# reports its exit status on the console. Any failure -> message + power off.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t devtmpfs devtmpfs /dev
exec </dev/null >/dev/console 2>&1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
# raw newlines on the console: the host must see exactly what COMMAND printed
stty -onlcr </dev/console 2>/dev/null

nonce=none verbose=0
for arg in $(cat /proc/cmdline); do
	case $arg in
	rdmx.nonce=*) nonce=${arg#*=} ;;
	rdmx.verbose=*) verbose=${arg#*=} ;;
	esac
done
log() { [ "$verbose" = 1 ] && echo "rdmx-init: [$(cut -d" " -f1 /proc/uptime)] $*"; return 0; }
fail() {
	echo "RDMX_GUEST_FAIL.$nonce: $*"
	dmesg | tail -n 25
	sync
	poweroff -f
	sleep 5
}
echo "RDMX_GUEST_BOOTED.$nonce"

# modules.list lines: <req|opt> <name> <file> [args...]
while read -r kind name file args; do
	[ -d "/sys/module/$name" ] && continue
	log "insmod $name"
	# shellcheck disable=SC2086 # args are word-split on purpose
	if ! insmod "/lib/modules/$file" $args 2>/tmp/insmod.err; then
		[ -d "/sys/module/$name" ] && continue
		[ "$kind" = req ] && fail "insmod $name: $(cat /tmp/insmod.err)"
		log "optional module $name not loaded: $(cat /tmp/insmod.err)"
	fi
done </lib/modules/modules.list
log "modules loaded"

opts=trans=virtio,version=9p2000.L,msize=262144
# The root never changes under us: let the guest cache it (much faster exec).
mount -t 9p -o "$opts,ro,cache=loose" hostroot /newroot || fail "cannot mount host root over 9p"
mount -t 9p -o "$opts,ro" rdmxctl /ctl || fail "cannot mount control share"
mount -t proc proc /newroot/proc || fail "mount /proc"
mount -t sysfs sysfs /newroot/sys || fail "mount /sys"
mount -t configfs configfs /newroot/sys/kernel/config 2>/dev/null
mount -t devtmpfs devtmpfs /newroot/dev || fail "mount /dev"
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts devpts /newroot/dev/pts
mount -t tmpfs -o mode=1777 tmpfs /newroot/dev/shm
for d in /tmp /var/tmp; do
	[ -d "/newroot$d" ] && { mount -t tmpfs -o mode=1777 tmpfs "/newroot$d" || fail "mount $d"; }
done
mount -t tmpfs -o mode=0755 tmpfs /newroot/run || fail "mount /run"
# Shares last: they may live below the tmpfs mounts above (sorted by the host
# so that a parent is mounted before a child). The directory exists on the
# read-only root unless it is under a fresh tmpfs, where mkdir creates it.
while read -r tag dir; do
	mkdir -p "/newroot$dir" 2>/dev/null
	# cache=mmap: uncached like the default, but shared writable mmap works
	mount -t 9p -o "$opts,cache=mmap" "$tag" "/newroot$dir" || fail "cannot mount share $dir"
done </ctl/shares
log "filesystems mounted"

# Give the guest a name that resolves: the host's /etc/hosts plus our
# entries, bind-mounted over the read-only original.
hostname rdmx-guest
if [ -f /newroot/etc/hosts ]; then
	{ cat /newroot/etc/hosts; echo "127.0.1.1 rdmx-guest"; } >/newroot/run/hosts
	mount -o bind /newroot/run/hosts /newroot/etc/hosts
fi
ip link set lo up
i=0
while [ ! -e /sys/class/net/eth0 ]; do
	i=$((i + 1)); [ $i -gt 50 ] && fail "no eth0"
	sleep 0.1
done
. /ctl/net
ip addr add "$GUEST_IP/$GUEST_PREFIX" dev eth0 || fail "ip addr add"
ip link set eth0 up || fail "ip link set eth0 up"
# The rdma tool (iproute2) comes from the host root.
hostrun() { env -i PATH="$GUEST_PATH" /bin/chroot /newroot "$@"; }
hostrun rdma link add "$RDMA_DEV" type "$RDMA_TYPE" netdev eth0 2>/tmp/rdma.err ||
	fail "rdma link add $RDMA_DEV failed: $(cat /tmp/rdma.err)"
# Port state as `rdma link show` reports it, read from sysfs: every exec of a
# host binary costs ~0.1 s under TCG.
i=0
until grep -q ACTIVE "/sys/class/infiniband/$RDMA_DEV/ports/1/state" 2>/dev/null; do
	i=$((i + 1)); [ $i -gt 100 ] && fail "$RDMA_DEV not ACTIVE after 10 s: $(hostrun rdma link show 2>&1)"
	sleep 0.1
done
log "$RDMA_DEV active"
if [ -n "$LINK_IP" ]; then
	i=0
	while [ ! -e /sys/class/net/eth1 ]; do
		i=$((i + 1)); [ $i -gt 50 ] && fail "no eth1 for --link"
		sleep 0.1
	done
	ip addr add "$LINK_IP/24" dev eth1 || fail "ip addr add $LINK_IP"
	ip link set eth1 up || fail "ip link set eth1 up"
	hostrun rdma link add rxe1 type rxe netdev eth1 2>/tmp/rdma.err ||
		fail "rdma link add rxe1 failed: $(cat /tmp/rdma.err)"
	i=0
	until grep -q ACTIVE /sys/class/infiniband/rxe1/ports/1/state 2>/dev/null; do
		i=$((i + 1)); [ $i -gt 100 ] && fail "rxe1 not ACTIVE after 10 s"
		sleep 0.1
	done
	log "rxe1 active on eth1 ($LINK_IP)"
fi

mkdir -p /newroot/run/rdmx
cp /ctl/run.sh /newroot/run/rdmx/run.sh || fail "cannot copy run.sh"
echo "RDMX_GUEST_START.$nonce"
env -i /bin/chroot /newroot /bin/sh /run/rdmx/run.sh
rc=$?
sync
echo "RDMX_GUEST_EXIT.$nonce=$rc"
# give the UART time to drain the marker before the machine vanishes
sleep 0.2
poweroff -f
sleep 5
INIT_EOF

# Ordered module list: "<req|opt> <name> <relative file> [args]". Host
# modprobe resolves dependencies (-C /dev/null: ignore the host's modprobe.d).
module_list() {
	local kind m line path name args seen=" "
	for m in $REQUIRED_MODULES $OPTIONAL_MODULES; do
		kind=opt
		[[ " $REQUIRED_MODULES " == *" $m "* ]] && kind=req
		local out
		if ! out=$(modprobe -C /dev/null -d "$kroot" -S "$kver" --show-depends "$m" 2>/dev/null); then
			[[ $kind == opt ]] && continue
			die "module $m not found in $kpkg"
		fi
		while read -r line; do
			[[ $line == insmod\ * ]] || continue # "builtin foo" needs no loading
			line=${line#insmod }
			path=${line%% *}
			args=
			[[ $line == *" "* ]] && args=${line#* }
			name=${path##*/}
			name=${name%%.ko*}
			name=${name//-/_}
			[[ $seen == *" $name "* ]] && continue
			seen+="$name "
			# dummy would create dummy0 by default; "load but don't configure".
			[[ $name == dummy ]] && args="numdummies=0"
			# Deps of an optional module are as optional as the module itself.
			local k=$kind
			[[ " $REQUIRED_MODULES " == *" $name "* ]] && k=req
			printf '%s %s %s %s\n' "$k" "$name" "${path#"$kroot"/}" "$args"
		done <<<"$out"
	done
}
modlist=$(module_list) || exit "$HARNESS_FAIL"
# One initramfs per provider (their module sets differ), so that alternating runs do
# not rebuild it each time.
initrd=$kdir/initramfs.cpio
[[ $provider == rxe ]] || initrd=$kdir/initramfs-$provider.cpio
key=$( {
	printf '%s\n' "$GUEST_INIT" "$modlist"
	sha256sum "$(command -v busybox)" | cut -d' ' -f1
} | sha256sum | cut -d' ' -f1)
if [[ ! -s $initrd || $(cat "${initrd%.cpio}.key" 2>/dev/null) != "$key" ]]; then
	msg "building initramfs"
	stage=$(mktemp -d "$kdir/initramfs.XXXXXX")
	mkdir -p "$stage"/{bin,dev,proc,sys,tmp,newroot,ctl,lib/modules}
	cp "$(command -v busybox)" "$stage/bin/busybox"
	ln -s busybox "$stage/bin/sh"
	printf '%s\n' "$GUEST_INIT" >"$stage/init"
	chmod 755 "$stage/init"
	while read -r _ name rel _; do
		src=$kroot/$rel
		dst=$stage/lib/modules/$name.ko
		case $src in
		*.ko) cp "$src" "$dst" ;;
		*.ko.xz) xz -dc "$src" >"$dst" ;;
		*.ko.zst) zstd -dcq "$src" >"$dst" ;;
		*.ko.gz) gzip -dc "$src" >"$dst" ;;
		*) die "unknown module format: $src" ;;
		esac
	done <<<"$modlist"
	# Loader list refers to the flattened copies.
	awk '{ n = $2; $3 = n ".ko"; print }' <<<"$modlist" >"$stage/lib/modules/modules.list"
	# Uncompressed cpio: the kernel unpacks it fastest, and it is only ~12 MB.
	(cd "$stage" && find . | busybox cpio -o -H newc -R 0:0 2>/dev/null) >"$initrd.tmp" ||
		die "cpio failed"
	mv "$initrd.tmp" "$initrd"
	printf '%s\n' "$key" >"${initrd%.cpio}.key"
	rm -rf "$stage"
fi

flock -u "$lock_fd"

# ---------------------------------------------------------------- this run
run=$(mktemp -d "${TMPDIR:-/tmp}/rxe-guest.XXXXXX")
qemu_pid='' filter_pid='' watchdog_pid=''
# shellcheck disable=SC2317 # invoked by the EXIT trap
cleanup() {
	local p
	for p in $watchdog_pid $qemu_pid $filter_pid; do kill "$p" 2>/dev/null || true; done
	rm -rf "$run"
}
trap cleanup EXIT
trap 'msg "interrupted"; exit "$HARNESS_FAIL"' INT TERM HUP

nonce=$(od -An -tx8 -N8 /dev/urandom | tr -d ' ')

# Shares: absolute physical paths, parents before children.
: >"$run/shares"
qshares=()
if ((${#shares[@]})); then
	for s in "${shares[@]}"; do
		[[ -d $s ]] || die "--share $s: not a directory"
		[[ $s != *$'\n'* ]] || die "--share path with a newline: $s"
	done
	mapfile -t sorted < <(for s in "${shares[@]}"; do (cd "$s" && pwd -P); done | LC_ALL=C sort -u)
	i=0
	for p in "${sorted[@]}"; do
		tag=share$i
		i=$((i + 1))
		printf '%s %s\n' "$tag" "$p" >>"$run/shares"
		qshares+=(-virtfs "local,path=${p//,/,,},mount_tag=$tag,security_model=none,multidevs=remap")
	done
fi

printf 'GUEST_IP=%s GUEST_PREFIX=%s RDMA_DEV=%s RDMA_TYPE=%s GUEST_PATH=%s LINK_IP=%s\n' \
	"$GUEST_IP" "$GUEST_PREFIX" "$RDMA_DEV" "$provider" "$GUEST_PATH" "$link_ip" >"$run/net"

# run.sh: executed by the guest's init as /bin/sh (dash) inside the chroot.
cwd=$(pwd -P)
{
	echo "# generated by $prog"
	echo "export PATH=$(shq "$GUEST_PATH") HOME=/tmp TERM=dumb USER=root LOGNAME=root"
	# Pass the caller's RDMX_* settings through (log levels etc.).
	while IFS= read -r -d '' kv; do
		name=${kv%%=*}
		[[ $name =~ ^RDMX_[A-Za-z0-9_]*$ ]] || continue
		echo "export $name=$(shq "${kv#*=}")"
	done < <(env -0)
	echo "export RDMX_GUEST_IP=$(shq "$GUEST_IP") RDMX_RDMA_DEVICE=$(shq "$RDMA_DEV")"
	[[ -z $link_ip ]] || echo "export RDMX_LINK_IP=$(shq "$link_ip") RDMX_LINK_DEV=eth1 RDMX_LINK_RDMA_DEVICE=rxe1"
	echo "ulimit -l unlimited 2>/dev/null"
	echo "cd $(shq "$cwd") 2>/dev/null || { echo $(shq "$prog: warning: $cwd is not visible in the guest (not under a --share?); running in /") >&2; cd /; }"
	cmd=
	for a in "$@"; do cmd+="$(shq "$a") "; done
	echo "exec /bin/sh -c $(shq "$cmd") </dev/null"
} >"$run/run.sh"

# Accelerator: KVM only with real VT-x/AMD-V (the /dev/kvm here may be PVM,
# in which a stock kernel dies); otherwise multi-threaded TCG.
# shellcheck disable=SC2054 # QEMU option values contain commas
accel=(-accel tcg,thread=multi -cpu max)
if [[ ${RDMX_GUEST_ACCEL:-auto} != tcg && -w /dev/kvm ]] && grep -qwE 'vmx|svm' /proc/cpuinfo; then
	accel=(-accel kvm -cpu host)
fi

append="console=ttyS0 panic=-1 rdmx.nonce=$nonce rdmx.verbose=$verbose"
((verbose)) || append+=" quiet loglevel=1"
# Boot-time trimming, each worth a few 100 ms under TCG: skip hardware the
# guest does not have, the crypto self-tests, ACPI PCI interrupt routing
# (virtio uses MSI-X; the ACPI interpreter is slow) and the TSC watchdog.
append+=" 8250.nr_uarts=1 i8042.noaux i8042.nokbd i8042.nopnp mitigations=off"
append+=" cryptomgr.notests pci=noacpi tsc=reliable no_timer_check"
# Debugging knob: extra kernel parameters.
append+=${RDMX_GUEST_APPEND:+ $RDMX_GUEST_APPEND}
# Debugging knob: extra QEMU arguments, split on spaces (for example a monitor socket:
# RDMX_GUEST_QEMU_ARGS="-monitor unix:/tmp/qmon,server=on,wait=off" for `info jit`).
read -r -a qemu_extra <<<"${RDMX_GUEST_QEMU_ARGS:-}"

# One boot attempt. $1 = kernel image, $2 = time limit (s). Sets run_rc
# (guest exit status or empty), boot_ok (whether init printed its first
# line) and qemu_rc.
boot() {
	local kernel=$1 limit=$2 qrc=0
	rm -f "$run/console" "$run/status" "$run/booted" "$run/watchdog"
	: >"$run/bootlog"
	mkfifo "$run/console"
	timeout -k 5 "$limit" qemu-system-x86_64 \
		-nodefaults -no-user-config -display none -no-reboot \
		-machine pc "${accel[@]}" -smp "$smp" -m "$mem" \
		-kernel "$kernel" -initrd "$initrd" -append "$append" \
		-chardev stdio,id=con,signal=off -serial chardev:con \
		-device virtio-net-pci,netdev=n0 -netdev user,id=n0,restrict=on "${link_qemu[@]}" \
		-virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap" \
		-virtfs "local,path=${run//,/,,},mount_tag=rdmxctl,security_model=none,readonly=on" \
		"${qshares[@]}" "${qemu_extra[@]}" \
		</dev/null >"$run/console" 2>"$run/qemu.err" &
	qemu_pid=$!
	filter_console <"$run/console" &
	filter_pid=$!
	# The guest reaches init in seconds; if it has not after 120 s it never
	# will (shorter limits are left to `timeout` alone).
	# (stdio to /dev/null: a leftover sleep must not hold meson's pipe open)
	local wd=$((limit > 120 ? 120 : limit + 60))
	(
		trap 'kill "$sp" 2>/dev/null; exit 0' TERM
		sleep "$wd" &
		sp=$!
		wait "$sp"
		[[ -e $run/booted ]] || { echo "$wd" >"$run/watchdog"; kill "$qemu_pid"; }
	) </dev/null >/dev/null 2>&1 &
	watchdog_pid=$!
	# (2>/dev/null: no "Killed" job notice from bash; we explain below)
	wait "$qemu_pid" 2>/dev/null || qrc=$?
	qemu_pid=
	wait "$filter_pid" || true
	filter_pid=
	kill "$watchdog_pid" 2>/dev/null || true
	wait "$watchdog_pid" 2>/dev/null || true
	watchdog_pid=
	run_rc=$(cat "$run/status" 2>/dev/null || true)
	boot_ok=0
	[[ -e $run/booted ]] && boot_ok=1
	qemu_rc=$qrc
}

# Console -> our stdout. Lines before the START marker are boot noise (kept
# in bootlog, shown with --verbose); after it everything is COMMAND output up
# to the EXIT marker, which may follow output lacking a final newline.
filter_console() {
	local line started=0 rc=
	while IFS= read -r line || [[ -n $line ]]; do
		if ((!started)); then
			if [[ $line == *"RDMX_GUEST_BOOTED.$nonce"* ]]; then
				touch "$run/booted"
				continue
			elif [[ $line == *"RDMX_GUEST_START.$nonce"* ]]; then
				started=1
				continue
			fi
			printf '%s\n' "$line" >>"$run/bootlog"
			((verbose)) && printf '%s\n' "$line" >&2
			continue
		fi
		[[ -n $rc ]] && continue
		if [[ $line == *"RDMX_GUEST_EXIT.$nonce="* ]]; then
			printf '%s' "${line%%"RDMX_GUEST_EXIT.$nonce="*}"
			rc=${line##*"RDMX_GUEST_EXIT.$nonce="}
			rc=${rc%%[!0-9]*}
			printf '%s\n' "$rc" >"$run/status"
			continue
		fi
		printf '%s\n' "$line"
	done
}

start=$SECONDS
kernel=$bzimage
[[ -e $vmlinux ]] && kernel=$vmlinux
boot "$kernel" "$timeout_s"
left=$((timeout_s - (SECONDS - start)))
if ((!boot_ok && left > 10)) && [[ $kernel == "$vmlinux" && ! -s $run/bootlog ]] && ((qemu_rc != 124)); then
	# The uncompressed kernel printed nothing at all (a kernel that boots but
	# fails later still prints its panic). Retry with the bzImage; if that
	# boots, the vmlinux is the problem: never use it again.
	msg "warning: guest did not boot from $vmlinux; retrying with the bzImage"
	boot "$bzimage" "$left"
	if ((boot_ok)); then
		touch "$kdir/vmlinux.bad"
		rm -f "$vmlinux"
	fi
fi

if [[ -n $run_rc ]]; then
	exit "$run_rc"
fi

# No exit marker: explain why, with the useful parts of the guest console.
if [[ -e $run/watchdog ]]; then
	msg "error: guest did not reach init within $(cat "$run/watchdog")s (killed)"
elif ((qemu_rc == 124 || qemu_rc == 137)); then
	msg "error: guest timed out after ${timeout_s}s (killed)"
elif ((!boot_ok)); then
	msg "error: guest did not boot (no output from init after $((SECONDS - start))s, qemu status $qemu_rc)"
elif grep -q "RDMX_GUEST_FAIL.$nonce" "$run/bootlog"; then
	msg "error: guest setup failed: $(grep "RDMX_GUEST_FAIL.$nonce" "$run/bootlog" | sed 's/^.*RDMX_GUEST_FAIL[^:]*: //')"
else
	msg "error: guest ended without reporting an exit status (crash/panic?), qemu status $qemu_rc"
fi
if [[ -s $run/qemu.err ]]; then
	msg "qemu stderr:"
	tail -n 20 "$run/qemu.err" >&2
fi
if [[ -s $run/bootlog ]] && ((!verbose)); then
	msg "guest console (last lines before the command):"
	tail -n 30 "$run/bootlog" >&2
fi
exit "$HARNESS_FAIL"
