/* libpmem.so.1 for the launcher image's QEMU: the two functions Debian's QEMU 7.2 imports
 * (version LIBPMEM_1.0, pmem.map), as msync(2) on the range, libpmem's own fallback for memory
 * that is not persistent memory. QEMU calls them only for a memory-backend-file with pmem=on
 * (and migration into one), which the launcher never renders (KubeVirt has no NVDIMM). Without
 * the real library the tree drops libndctl, libdaxctl, libkmod and the libcrypto libkmod pulls
 * in: 5.4 MB. Built by scripts/assemble-launcher-tree, which keeps Debian's library when this one
 * does not define every symbol QEMU takes from it. */
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static void sync_range(const void *addr, size_t len)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t start = (uintptr_t)addr & ~(page - 1);

    if (len) {
        msync((void *)start, (uintptr_t)addr + len - start, MS_SYNC);
    }
}

void pmem_persist(const void *addr, size_t len)
{
    sync_range(addr, len);
}

void *pmem_memcpy_persist(void *dest, const void *src, size_t len)
{
    memcpy(dest, src, len);
    sync_range(dest, len);
    return dest;
}
