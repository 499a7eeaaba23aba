"""AutoGraph's conversions, learned from the warm trainer server's children and made once in the server.

A served trainer run spends about a third of its CPU after the fork (0.8-1 CPU-s of 2.5-3 for the
tests' 60-step synthetic run) turning its `tf.function`s and `tf.data` functions into graph code:
AutoGraph parses each function's source and rewrites it (`PyToPy.transform_function`). AutoGraph
caches each result in the process by the function's code object and the conversion's options, so
the result does not depend on the function's closure or on which call made it. A child's cache dies
with the child, though, so every run converted the same functions again.

- A served child (`record`) appends a line to `<socket>.autograph` for each conversion it had to
  make: the code object's file, first line and qualified name, and the options.
- The server (`Learned.take`, after it reaps a child) reads the lines it has not read, finds each
  code object among its own imported modules (a module's functions, its classes' methods, and the
  functions nested in them, through their code's constants), and converts it itself with the same
  options. Later children inherit the server's cache, so their conversions are cache hits.

A conversion only reads source and compiles Python: the server still runs no TensorFlow op and
starts no thread. Code the server has not imported (a user's script, `trainer/__main__.py`, which
each run executes anew) is skipped, as is a name that two functions share on one line.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import types


def _features(options) -> list[str]:
    return sorted(feature.name for feature in options.optional_features)


def record(path: str) -> None:
    """In a served child: log each conversion AutoGraph makes (a cache miss) to `path`."""
    from tensorflow.python.autograph.pyct import transpiler

    convert = transpiler.PyToPy.transform_function

    def transform_function(self, fn, user_context):
        subkey = self.get_caching_key(user_context)
        missed = not self._cache.has(fn, subkey)  # noqa: SLF001 - the cache AutoGraph checks first
        result = convert(self, fn, user_context)
        code = getattr(fn, "__code__", None)
        if missed and isinstance(code, types.CodeType):
            line = json.dumps([code.co_filename, code.co_firstlineno, code.co_qualname, subkey.recursive,
                               subkey.user_requested, subkey.internal_convert_user_code, _features(subkey)])
            # One write of one line, appended: lines from children running at once never interleave.
            with contextlib.suppress(OSError):
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                try:
                    os.write(fd, (line + "\n").encode())
                finally:
                    os.close(fd)
        return result

    transpiler.PyToPy.transform_function = transform_function


def _codes(code: types.CodeType, out: dict) -> None:
    """`code` and the code nested in it (its functions, lambdas and classes), by file line and name."""
    found = out.setdefault((code.co_firstlineno, code.co_qualname), [])
    if any(c is code for c in found):
        return  # reached again (a class attribute naming a module function): one code object, not two
    found.append(code)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _codes(const, out)


def _module_codes(module: types.ModuleType) -> dict:
    file, out, seen = module.__file__, {}, set()
    values = list(vars(module).values())
    for value in values:
        if isinstance(value, type) and value.__module__ == module.__name__:
            values.extend(vars(value).values())  # its methods, properties and nested classes
    for value in values:
        for attr in ("__func__", "fget", "fset", "python_function", "__wrapped__"):
            value = getattr(value, attr, None) or value
        code = getattr(value, "__code__", None)
        if isinstance(code, types.CodeType) and code.co_filename == file and id(code) not in seen:
            seen.add(id(code))
            _codes(code, out)
    return out


class Learned:
    """The server's side: the conversions its children logged, made here once each."""

    def __init__(self, path: str):
        self.path, self.offset = path, 0
        self.done: set[str] = set()
        self._modules: dict[str, dict] = {}  # a module's file -> its code objects by (line, name)

    def _find(self, file: str, line: int, name: str) -> tuple[types.CodeType, dict] | None:
        module = next((m for m in list(sys.modules.values())
                       if isinstance(m, types.ModuleType) and getattr(m, "__file__", None) == file), None)
        if module is None:
            return None
        if file not in self._modules:
            self._modules[file] = _module_codes(module)
        found = self._modules[file].get((line, name), [])
        return (found[0], vars(module)) if len(found) == 1 else None

    def take(self) -> int:
        """Convert what the children logged since the last call; how many conversions were made."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return 0
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next call
        self.offset += end
        made = 0
        for raw in data[:end].decode().splitlines():
            if raw in self.done:
                continue
            self.done.add(raw)
            with contextlib.suppress(Exception):  # a conversion that fails here is made by the child, as before
                made += self._convert(*json.loads(raw))
        return made

    def _convert(self, file, line, name, recursive, user_requested, convert_user_code, features) -> int:
        from tensorflow.python.autograph.core import converter
        from tensorflow.python.autograph.impl import api

        found = self._find(file, line, name)
        if found is None:
            return 0
        code, namespace = found
        # Cells holding a placeholder: the closure's names are in the conversion's namespace, as in the
        # child's (its generated names avoid them); their values play no part in the conversion.
        fn = types.FunctionType(code, namespace, code.co_name, None,
                                tuple(types.CellType(None) for _ in code.co_freevars))
        options = converter.ConversionOptions(
            recursive=recursive, user_requested=user_requested, internal_convert_user_code=convert_user_code,
            optional_features=[converter.Feature[f] for f in features])
        api._TRANSPILER.transform(fn, converter.ProgramContext(options=options))  # noqa: SLF001 - the cache children inherit
        return 1
