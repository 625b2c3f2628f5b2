/* pymalloc's arenas on transparent huge pages: the simulator's small objects on 2 MiB pages.
 *
 * Theory of operation. CPython's small-object allocator (pymalloc) takes its memory
 * from the system an arena at a time (1 MiB on 64-bit CPython 3.10 and later,
 * ARENA_SIZE in Objects/obmalloc.c), through a replaceable arena allocator whose
 * default is one mmap and one munmap per arena. The kernel backs those with 4 KiB
 * pages when transparent huge pages are in `madvise` mode: a simulation spread over a
 * gigabyte of small objects then misses the TLB on most of its cache misses.
 *
 * `install` replaces the arena allocator with one that carves arenas out of regions
 * of REGION_BYTES, each mapped once, aligned to 2 MiB and advised MADV_HUGEPAGE, so
 * the kernel backs them with huge pages as they are first touched. Arenas are handed
 * out in address order, two to a huge page; an arena pymalloc gives back is kept on a
 * free list (last freed, first reused: its pages are the likeliest to be in cache)
 * and never returned to the system. Returning it (MADV_DONTNEED) would split the huge
 * page it shares with its neighbour, and a run's or a sweep worker's next run reuses
 * the memory anyway: the process keeps its peak of small-object memory until it
 * exits. Arenas made before `install` (the interpreter's start) and any request of
 * another size stay with the previous allocator, which frees them as it made them;
 * an arena is ours if its address is in one of our regions.
 *
 * pymalloc calls the arena allocator with the GIL held (one allocator per process in
 * CPython 3.11 and 3.12), so nothing here locks. There is no uninstall: arenas of
 * ours may be live until the process ends.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <sys/mman.h>

#define HUGE_PAGE_BYTES ((size_t)2 << 20)
#define REGION_BYTES ((size_t)64 << 20)
#define MAX_REGIONS 4096 /* 256 GiB of arenas */

typedef struct FreeArena {
    struct FreeArena *next;
} FreeArena;

static PyObjectArenaAllocator previous;
static int installed;
static size_t arena_bytes;        /* the size pymalloc asks for, learnt at its first call */
static char *regions[MAX_REGIONS]; /* each REGION_BYTES long, 2 MiB aligned */
static size_t region_count;
static char *next_arena, *region_end; /* the unused rest of the newest region */
static FreeArena *free_arenas;
static size_t arenas_in_use, arenas_free;

/* A new region of REGION_BYTES aligned to a huge page: over-map by one huge page and
 * unmap the ends. Returns 0 on success. */
static int map_region(void) {
    if (region_count == MAX_REGIONS)
        return -1;
    size_t span = REGION_BYTES + HUGE_PAGE_BYTES;
    char *raw = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return -1;
    char *base = (char *)(((uintptr_t)raw + HUGE_PAGE_BYTES - 1) & ~(HUGE_PAGE_BYTES - 1));
    if (base > raw)
        munmap(raw, (size_t)(base - raw));
    if (raw + span > base + REGION_BYTES)
        munmap(base + REGION_BYTES, (size_t)(raw + span - (base + REGION_BYTES)));
    /* Without THP support the advice fails and the region is an ordinary mapping. */
    (void)madvise(base, REGION_BYTES, MADV_HUGEPAGE);
    regions[region_count++] = base;
    next_arena = base;
    region_end = base + REGION_BYTES;
    return 0;
}

static int ours(const void *ptr) {
    const char *p = ptr;
    for (size_t i = 0; i < region_count; i++)
        if (p >= regions[i] && p < regions[i] + REGION_BYTES)
            return 1;
    return 0;
}

static void *arena_alloc(void *ctx, size_t size) {
    (void)ctx;
    if (arena_bytes == 0 && size > 0 && REGION_BYTES % size == 0 && size % 4096 == 0)
        arena_bytes = size;
    if (size != arena_bytes)
        return previous.alloc(previous.ctx, size);
    void *arena;
    if (free_arenas != NULL) {
        arena = free_arenas;
        free_arenas = free_arenas->next;
        arenas_free--;
    } else {
        if (next_arena == region_end && map_region() != 0)
            return previous.alloc(previous.ctx, size); /* out of regions: as before */
        arena = next_arena;
        next_arena += arena_bytes;
    }
    arenas_in_use++;
    return arena;
}

static void arena_free(void *ctx, void *ptr, size_t size) {
    (void)ctx;
    if (ptr == NULL || !ours(ptr)) {
        previous.free(previous.ctx, ptr, size);
        return;
    }
    FreeArena *arena = ptr;
    arena->next = free_arenas;
    free_arenas = arena;
    arenas_in_use--;
    arenas_free++;
}

static PyObject *install(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    if (installed)
        Py_RETURN_FALSE;
    PyObject_GetArenaAllocator(&previous);
    PyObjectArenaAllocator allocator = {NULL, arena_alloc, arena_free};
    PyObject_SetArenaAllocator(&allocator);
    installed = 1;
    Py_RETURN_TRUE;
}

static PyObject *stats(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    PyObject *spans = PyList_New((Py_ssize_t)region_count);
    if (spans == NULL)
        return NULL;
    for (size_t i = 0; i < region_count; i++) {
        PyObject *span = Py_BuildValue("(Kn)", (unsigned long long)(uintptr_t)regions[i],
                                       (Py_ssize_t)REGION_BYTES);
        if (span == NULL) {
            Py_DECREF(spans);
            return NULL;
        }
        PyList_SET_ITEM(spans, (Py_ssize_t)i, span);
    }
    return Py_BuildValue("{s:O,s:n,s:n,s:n,s:N}", "installed", installed ? Py_True : Py_False,
                         "arena_bytes", (Py_ssize_t)arena_bytes,
                         "arenas_in_use", (Py_ssize_t)arenas_in_use,
                         "arenas_free", (Py_ssize_t)arenas_free, "regions", spans);
}

static PyMethodDef methods[] = {
    {"install", install, METH_NOARGS,
     "install() -> bool\n\nHand pymalloc its arenas from huge-page regions from now on; "
     "False if already installed."},
    {"stats", stats, METH_NOARGS,
     "stats() -> dict\n\nWhether installed, the arena size, arenas in use and on the free "
     "list, and the regions as (address, bytes)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "simulations._hugearena",
    "pymalloc's arenas from regions advised MADV_HUGEPAGE (see simulations.hugearena).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__hugearena(void) { return PyModule_Create(&module); }
