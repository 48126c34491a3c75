/*
 * The KVM probe guest of qlauncher (src/monitor/kvm_probe.rs embeds its bytes; the test
 * `kvm_probe::tests::bytes_match_the_source` reassembles this file and compares).
 *
 * QEMU loads it as the last 512 bytes of a 64 KiB `-bios` image, so its first byte sits at
 * 0xfffffe00 (and, through the ISA BIOS alias, at 0xffe00). It boots the way a Linux kernel does:
 * real mode -> 32-bit protected mode -> PAE paging + long mode, then runs a compute loop and
 * fills and checks memory, which is what a guest whose vCPU is emulated instruction by instruction
 * (nested KVM without hardware virtualization) cannot do in time. Each stage writes one byte to
 * the debug console (isa-debugcon at port 0x402): 'R' real mode, 'P' protected mode, 'L' long
 * mode, 'C' compute loop done, 'M' memory filled and checked. Success is the value 0x2a written to
 * isa-debug-exit (port 0xf4): QEMU exits with status (0x2a << 1) | 1 = 85. A memory mismatch
 * writes 'X' and exits with status (0x15 << 1) | 1 = 43.
 *
 * Assemble: as --64 -o kvm_probe.o kvm_probe.S && objcopy -O binary -j .text kvm_probe.o kvm_probe.bin
 */
    .set BASE, 0xfffffe00           /* linear address of the first byte */
    .set LOW, BASE & 0xfffff        /* the same byte through the ISA BIOS alias below 1 MiB */
    .set PML4, 0x1000               /* page tables in RAM: PML4, PDPT, one PD of 2 MiB pages */
    .set PDPT, 0x2000
    .set PD, 0x3000
    .set DEBUGCON, 0x402
    .set DEBUG_EXIT, 0xf4
    .set LOOPS, 10000000            /* compute loop iterations */
    .set FILL, 0x200000             /* memory filled: [2 MiB, 10 MiB) */
    .set FILL_QWORDS, 0x100000      /* 8 MiB */

    .text
    .code16
start:                              /* real mode, CS base 0xffff0000 */
    cli
    cld
    movw $DEBUGCON, %dx
    movb $'R', %al
    outb %al, %dx
    lgdtl %cs:(gdtr - start + (BASE & 0xffff))
    movl %cr0, %eax
    orb $1, %al                     /* CR0.PE */
    movl %eax, %cr0
    ljmpl $0x08, $(pm32 - start + LOW)

    .code32
pm32:                               /* flat 32-bit protected mode, running below 1 MiB */
    movl $0x10, %eax
    movl %eax, %ds
    movl %eax, %es
    movl %eax, %ss
    movb $'P', %al
    outb %al, %dx
    movl $PML4, %edi                /* zero PML4, PDPT and PD */
    xorl %eax, %eax
    movl $(3 * 1024), %ecx
    rep stosl
    movl $(PDPT | 3), PML4          /* present, writable */
    movl $(PD | 3), PDPT
    movl $PD, %edi                  /* identity-map the first 1 GiB with 2 MiB pages */
    movl $0x83, %eax                /* present, writable, page size */
    movl $512, %ecx
1:  movl %eax, (%edi)
    addl $0x200000, %eax
    addl $8, %edi
    loop 1b
    movl %cr4, %eax
    orb $0x20, %al                  /* CR4.PAE */
    movl %eax, %cr4
    movl $PML4, %eax
    movl %eax, %cr3
    movl $0xc0000080, %ecx          /* EFER.LME */
    rdmsr
    orb $1, %ah
    wrmsr
    movl %cr0, %eax
    orl $0x80000000, %eax           /* CR0.PG: long mode becomes active */
    movl %eax, %cr0
    ljmpl $0x18, $(lm64 - start + LOW)

    .code64
lm64:                               /* 64-bit long mode with paging */
    movw $DEBUGCON, %dx
    movb $'L', %al
    outb %al, %dx
    movl $LOOPS, %ecx               /* compute loop */
1:  decl %ecx
    jnz 1b
    movb $'C', %al
    outb %al, %dx
    movabsq $0x5a5aa5a5c3c33c3c, %rax
    movl $FILL, %edi                /* fill 8 MiB with a pattern */
    movl $FILL_QWORDS, %ecx
    rep stosq
    movl $FILL, %edi                /* and check it */
    movl $FILL_QWORDS, %ecx
    repe scasq
    jne bad
    movb $'M', %al
    outb %al, %dx
    movb $0x2a, %al                 /* success: QEMU exits with status 85 */
    jmp done
bad:
    movb $'X', %al
    outb %al, %dx
    movb $0x15, %al                 /* memory mismatch: QEMU exits with status 43 */
done:
    movw $DEBUG_EXIT, %dx
    outb %al, %dx
2:  hlt
    jmp 2b

    .balign 8, 0
gdt:
    .quad 0                         /* null */
    .quad 0x00cf9b000000ffff        /* 0x08: 32-bit code, flat */
    .quad 0x00cf93000000ffff        /* 0x10: data, flat */
    .quad 0x00af9b000000ffff        /* 0x18: 64-bit code */
gdt_end:
gdtr:
    .word gdt_end - gdt - 1
    .long gdt - start + LOW

    .org 0x200 - 16                 /* the reset vector, 0xfffffff0 */
    .code16
reset:
    jmp start
    .org 0x200
