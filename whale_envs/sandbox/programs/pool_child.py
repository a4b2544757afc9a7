"""A pooled sandbox's program: its ``main.py`` until the code comes (:mod:`whale_envs.sandbox.pool`).

Its stdin is a pipe from the caller, which sends two messages, each 8 bytes of length then the bytes:
at once its settings (``"<cpu_s> <module>,<module>,..."``), and when a call takes it the code. The
program imports the modules (the preload), says it is ready (one byte ``\\0`` on stdout, which the
caller takes out), reads the code, puts /dev/null on stdin, writes the code over ``main.py``, sets the
CPU limit of the code (what it has used so far + ``cpu_s``) and runs the code as ``__main__`` in this
module's namespace, emptied first; a traceback shows the code's frames alone, as ``python main.py``
would. The caller's end of stdin is its only input.

Standard library only (it runs as its own text: nothing else is loaded into the code's interpreter).
"""

import os


def _read(n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = os.read(0, n - len(data))
        if not chunk:  # the caller gave the call up before sending it
            os._exit(0)
        data += chunk
    return data


def _message() -> bytes:
    return _read(int.from_bytes(_read(8), "big"))


def main() -> None:
    import resource
    import sys  # a local name: the module's globals are emptied for the code

    cpu_s, preload = _message().decode().split(" ")
    for name in filter(None, preload.split(",")):
        try:
            __import__(name)
        except Exception:  # noqa: BLE001, S110 - the code imports it again and sees the error itself
            pass
    os.write(1, b"\0")
    code = _message()
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    namespace = sys.modules["__main__"].__dict__
    with open(namespace["__file__"], "wb") as fh:
        fh.write(code)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = int(cpu_s) + round(usage.ru_utime + usage.ru_stime)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    # what `python main.py` starts with: the interpreter's own names, no docstring
    fresh = {k: v for k, v in namespace.items() if k.startswith("__") and k.endswith("__")}
    namespace.clear()
    namespace.update(fresh, __doc__=None)
    try:
        exec(compile(code, namespace["__file__"], "exec", dont_inherit=True), namespace)
    except SystemExit:
        raise
    except BaseException as exc:  # as the interpreter would print it, without this function's frame
        exc = exc.with_traceback(exc.__traceback__.tb_next)
        sys.excepthook(type(exc), exc, exc.__traceback__)
        sys.exit(1)


if __name__ == "__main__":
    main()
