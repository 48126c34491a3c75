# Shared functions of the qlauncher test guest (sourced by /init). Guest code, not product code.

# say WORDS: prints one "QLG: WORDS" marker line on the serial console.
say() {
  echo "QLG: $*" >/dev/ttyS0
}

# list_disks: names of the whole-disk block devices, one per line.
list_disks() {
  for d in /sys/block/*; do
    n=${d##*/}
    case "$n" in
      loop* | ram* | zram* | nbd* | '*') continue ;;
    esac
    echo "$n"
  done
}

# list_nics: names of the network interfaces backed by a device (not lo, not virtual links).
list_nics() {
  for d in /sys/class/net/*; do
    [ -e "$d/device" ] || continue
    echo "${d##*/}"
  done
}

# disk_size NAME: size of the disk in bytes.
disk_size() {
  s=$(cat "/sys/block/$1/size" 2>/dev/null || echo 0)
  echo $((s * 512))
}

# nic_start NAME: brings the NIC up and runs a DHCP client on it in the background.
nic_start() {
  ip link set "$1" up
  udhcpc -f -i "$1" -s /etc/qlg/udhcpc.script -t 5 -T 1 -A 3 -O mtu -O search \
    >/dev/null 2>&1 </dev/null &
}

# word_in WORD LIST: true when WORD is one of the whitespace-separated words of LIST.
word_in() {
  case " $(echo $2) " in
    *" $1 "*) return 0 ;;
  esac
  return 1
}

# watch_devices: prints "disk"/"nic" markers for what exists, then polls every second and prints
# "disk-added"/"disk-removed"/"nic-added"/"nic-removed"; starts DHCP on every NIC.
watch_devices() {
  disks=$(list_disks)
  nics=$(list_nics)
  for d in $disks; do say "disk $d size=$(disk_size "$d")"; done
  for n in $nics; do
    say "nic $n mac=$(cat "/sys/class/net/$n/address")"
    nic_start "$n"
  done
  while :; do
    sleep 1
    new_disks=$(list_disks)
    new_nics=$(list_nics)
    for d in $new_disks; do
      word_in "$d" "$disks" || say "disk-added $d size=$(disk_size "$d")"
    done
    for d in $disks; do
      word_in "$d" "$new_disks" || say "disk-removed $d"
    done
    for n in $new_nics; do
      if ! word_in "$n" "$nics"; then
        say "nic-added $n mac=$(cat "/sys/class/net/$n/address")"
        nic_start "$n"
      fi
    done
    for n in $nics; do
      word_in "$n" "$new_nics" || say "nic-removed $n"
    done
    disks=$new_disks
    nics=$new_nics
  done
}

# iso_label DEV: the ISO 9660 volume identifier of /dev/DEV, trailing blanks removed.
iso_label() {
  dd if="/dev/$1" bs=1 skip=32808 count=32 2>/dev/null | tr -d '\000' | sed 's/ *$//'
}

# print_file MARKER FILE: prints "QLG: MARKER <base64 of FILE on one line>" when FILE exists.
print_file() {
  [ -f "$2" ] && say "$1 $(base64 -w 0 "$2")"
}

# read_cidata: finds a NoCloud ("cidata") or ConfigDrive ("config-2") disk and prints its files.
read_cidata() {
  for d in $(list_disks); do
    mount -t iso9660 -o ro "/dev/$d" /mnt/cidata 2>/dev/null ||
      mount -t vfat -o ro "/dev/$d" /mnt/cidata 2>/dev/null || continue
    if [ -f /mnt/cidata/user-data ] || [ -f /mnt/cidata/meta-data ]; then
      say "cidata $d type=nocloud label=$(iso_label "$d")"
      print_file user-data /mnt/cidata/user-data
      print_file meta-data /mnt/cidata/meta-data
      print_file network-config /mnt/cidata/network-config
      return 0
    fi
    if [ -d /mnt/cidata/openstack/latest ]; then
      say "cidata $d type=configdrive label=$(iso_label "$d")"
      print_file user-data /mnt/cidata/openstack/latest/user_data
      print_file meta-data /mnt/cidata/openstack/latest/meta_data.json
      print_file network-config /mnt/cidata/openstack/latest/network_data.json
      return 0
    fi
    umount /mnt/cidata
  done
  say "cidata none"
}

# mount_data: mounts the ext4 file system labelled qlgdata read-write on /data and prints
# "QLG: data DEV mounted=/data" (or "QLG: data none" / "QLG: data failed DEV").
mount_data() {
  dev=$(findfs LABEL=qlgdata 2>/dev/null)
  if [ -z "$dev" ]; then
    say "data none"
    return 0
  fi
  mkdir -p /data
  if mount -t ext4 -o rw "$dev" /data; then
    say "data $dev mounted=/data"
  else
    say "data failed $dev"
  fi
}

# le32 N: the 4 little-endian bytes of N.
le32() {
  n=$1
  for i in 0 1 2 3; do
    printf "\\$(printf %03o $((n & 255)))"
    n=$((n >> 8))
  done
}

# field TEXT SIZE: TEXT padded with NUL bytes to SIZE bytes.
field() {
  printf '%s' "$1"
  head -c $(($2 - ${#1})) /dev/zero
}

# write_utmp USER LINE: appends a USER_PROCESS record (glibc x86_64 struct utmp, 384 bytes) for
# USER logged in on LINE now to /var/run/utmp.
write_utmp() {
  {
    printf '\007\000\000\000'
    le32 1
    field "$2" 32
    field "${2#tty}" 4
    field "$1" 32
    field "" 256
    field "" 8
    le32 "$(date +%s)"
    field "" 40
  } >>/var/run/utmp
}
