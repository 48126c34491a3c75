/* libcapstone.so.4 for the launcher image's QEMU: the five functions Debian's QEMU 7.2 imports,
 * with no disassembler behind them. QEMU disassembles only for `-d in_asm`/`out_asm` logging and
 * the human monitor's `x/i`, neither of which the launcher uses; when cs_open fails QEMU prints
 * the instruction bytes instead (disas/capstone.c falls back). Built by
 * scripts/assemble-launcher-tree, which keeps Debian's library when this one does not define
 * every symbol QEMU takes from it. 14 KB against capstone's 6.7 MB. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef size_t csh;

/* cs_err values (capstone.h). */
enum { CS_ERR_OK = 0, CS_ERR_ARCH = 2, CS_ERR_HANDLE = 3 };

int cs_open(int arch, int mode, csh *handle)
{
    (void)arch;
    (void)mode;
    if (handle) {
        *handle = 0;
    }
    return CS_ERR_ARCH;
}

int cs_option(csh handle, int type, size_t value)
{
    (void)handle;
    (void)type;
    (void)value;
    return CS_ERR_HANDLE;
}

int cs_close(csh *handle)
{
    if (handle) {
        *handle = 0;
    }
    return CS_ERR_OK;
}

void *cs_malloc(csh handle)
{
    (void)handle;
    return NULL;
}

bool cs_disasm_iter(csh handle, const uint8_t **code, size_t *size, uint64_t *address, void *insn)
{
    (void)handle;
    (void)code;
    (void)size;
    (void)address;
    (void)insn;
    return false;
}
