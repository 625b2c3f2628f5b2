/* The agent's byte path in C: a piece's payload received, hashed and written in one call.
 *
 * Theory of operation. `pull` runs in one of the agent's byte-moving threads
 * (p2p.bytepath) with the GIL released for its whole length. It takes a
 * chunk buffer, the part of it already received, and the part still to come:
 * it first hashes and writes (pwrite) the bytes received but not yet taken,
 * then loops recv(MSG_DONTWAIT) into the buffer -> XXH3-128 update -> pwrite
 * of the same bytes, TAKE_BYTES at a time (a recv right after a big one brings a
 * few KiB, and a pwrite of those into new page-cache pages costs nearly as
 * much as a big one), while they are still in the CPU's cache. When the socket
 * is empty it polls for at most `linger_ms` (waking once `wake` bytes are
 * there, through SO_RCVLOWAT) and returns if nothing came: a slow or silent
 * peer never holds a byte-moving thread for long, and the event loop keeps the
 * time limits, cancels and closes (a shutdown of the socket ends the poll).
 *
 * Nothing is verified here: the caller compares the digest with the manifest's
 * before the file counts (p2p.spool). A failing pwrite stops the writing, not
 * the hashing, and its errno is returned: the caller then stores the chunk
 * from the buffer by another way. The pure-Python twin is p2p.bytepath.pull_py.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <xxhash.h>

enum { FILLED = 0, DRAINED = 1, CLOSED = 2 };
#define TAKE_BYTES (512 * 1024)

typedef struct {
    PyObject_HEAD
    XXH3_state_t *state;
    int busy; /* a pull or update is using the state (without the GIL) */
} Xxh3Object;

static PyTypeObject Xxh3Type;

static PyObject *xxh3_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, ":Xxh3", kwlist))
        return NULL;
    Xxh3Object *self = (Xxh3Object *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->state = XXH3_createState();
    if (self->state == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    XXH3_128bits_reset(self->state);
    return (PyObject *)self;
}

static void xxh3_dealloc(Xxh3Object *self) {
    if (self->state != NULL)
        XXH3_freeState(self->state);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Claim the state for one call without the GIL; a second concurrent user is a bug. */
static int xxh3_claim(Xxh3Object *self) {
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "Xxh3 state is in use by another call");
        return -1;
    }
    self->busy = 1;
    return 0;
}

static PyObject *xxh3_update(Xxh3Object *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (xxh3_claim(self) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    XXH3_128bits_update(self->state, view.buf, (size_t)view.len);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

static PyObject *xxh3_digest(Xxh3Object *self, PyObject *Py_UNUSED(ignored)) {
    XXH128_canonical_t canonical;
    XXH128_canonicalFromHash(&canonical, XXH3_128bits_digest(self->state));
    return PyBytes_FromStringAndSize((const char *)canonical.digest, sizeof canonical.digest);
}

static PyMethodDef xxh3_methods[] = {
    {"update", (PyCFunction)xxh3_update, METH_O, "Hash the next bytes (GIL released)."},
    {"digest", (PyCFunction)xxh3_digest, METH_NOARGS,
     "The XXH3-128 digest so far, big-endian (as xxhash.xxh3_128().digest())."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject Xxh3Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "p2p._bytepath.Xxh3",
    .tp_basicsize = sizeof(Xxh3Object),
    .tp_dealloc = (destructor)xxh3_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An XXH3-128 hasher fed in parts, usable by pull without the GIL.",
    .tp_methods = xxh3_methods,
    .tp_new = xxh3_new,
};

/* Hash `n` bytes at `p`, then write them at `offset` of `*out_fd` unless writing stopped. */
static void take(XXH3_state_t *state, const char *p, size_t n, int *out_fd, off_t offset,
                 int *write_errno) {
    XXH3_128bits_update(state, p, n);
    while (n > 0 && *out_fd >= 0) {
        ssize_t w = pwrite(*out_fd, p, n, offset);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            *write_errno = w < 0 ? errno : EIO;
            *out_fd = -1;
            break;
        }
        p += w;
        n -= (size_t)w;
        offset += w;
    }
}

static PyObject *bytepath_pull(PyObject *Py_UNUSED(module), PyObject *args) {
    int sock_fd, out_fd, linger_ms, wake, lowat;
    PyObject *buffer;
    Xxh3Object *hasher;
    Py_ssize_t taken, filled, stop;
    long long out_offset;
    if (!PyArg_ParseTuple(args, "iOnnnO!iLiii:pull", &sock_fd, &buffer, &taken, &filled, &stop,
                          &Xxh3Type, &hasher, &out_fd, &out_offset, &linger_ms, &wake, &lowat))
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(buffer, &view, PyBUF_WRITABLE) < 0)
        return NULL;
    if (taken < 0 || taken > filled || filled > stop || stop > view.len || wake < 1) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "pull: need 0 <= taken <= filled <= stop <= len, wake >= 1");
        return NULL;
    }
    if (xxh3_claim(hasher) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    char *buf = view.buf;
    Py_ssize_t pos = filled;
    int state = FILLED, read_errno = 0, write_errno = 0;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t done = taken; /* bytes hashed and written */
    while (pos < stop) {
        ssize_t n = recv(sock_fd, buf + pos, (size_t)(stop - pos), MSG_DONTWAIT);
        if (n > 0) {
            pos += n;
            if (pos - done >= TAKE_BYTES) {
                take(hasher->state, buf + done, (size_t)(pos - done), &out_fd,
                     (off_t)(out_offset + (done - taken)), &write_errno);
                done = pos;
            }
            continue;
        }
        if (n == 0) {
            state = CLOSED;
            break;
        }
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            read_errno = errno;
            break;
        }
        int want = stop - pos < wake ? (int)(stop - pos) : wake;
        if (want != lowat && setsockopt(sock_fd, SOL_SOCKET, SO_RCVLOWAT, &want, sizeof want) == 0)
            lowat = want;
        struct pollfd pfd = {.fd = sock_fd, .events = POLLIN};
        int ready = poll(&pfd, 1, linger_ms);
        if (ready == 0) {
            state = DRAINED;
            break;
        }
        if (ready < 0 && errno != EINTR) {
            read_errno = errno;
            break;
        }
    }
    take(hasher->state, buf + done, (size_t)(pos - done), &out_fd,
         (off_t)(out_offset + (done - taken)), &write_errno);
    Py_END_ALLOW_THREADS
    hasher->busy = 0;
    PyBuffer_Release(&view);
    if (read_errno != 0) {
        errno = read_errno;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return Py_BuildValue("(niii)", pos, state, write_errno, lowat);
}

static PyMethodDef bytepath_methods[] = {
    {"pull", bytepath_pull, METH_VARARGS,
     "pull(sock_fd, buffer, taken, filled, stop, hasher, out_fd, out_offset, linger_ms, wake,"
     " lowat) -> (filled, state, write_errno, lowat)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef bytepath_module = {
    PyModuleDef_HEAD_INIT, "p2p._bytepath",
    "Receive, hash (XXH3-128) and write a piece's payload without the GIL (see p2p.bytepath).",
    -1, bytepath_methods,
};

PyMODINIT_FUNC PyInit__bytepath(void) {
    if (PyType_Ready(&Xxh3Type) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&bytepath_module);
    if (module == NULL)
        return NULL;
    Py_INCREF(&Xxh3Type);
    if (PyModule_AddObject(module, "Xxh3", (PyObject *)&Xxh3Type) < 0 ||
        PyModule_AddIntConstant(module, "FILLED", FILLED) < 0 ||
        PyModule_AddIntConstant(module, "DRAINED", DRAINED) < 0 ||
        PyModule_AddIntConstant(module, "CLOSED", CLOSED) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
