"""Validate payloads against the official OpenAI OpenAPI description (the wire-format authority).

    from tests.openapi_schema import validate, validate_stream_event
    validate("CreateResponse", body)          # raises SchemaViolation with a readable message
    validate_stream_event(event)              # ResponseStreamEvent and its specific member

How the spec is read (responses-api.md §10):
- `oneOf` → `anyOf`: jsonschema ignores OpenAPI's `discriminator`, so overlapping `oneOf`
  members (e.g. `EasyInputMessage` vs `InputMessage`) would fail "valid under each of".
- OpenAPI 3.0 `nullable: true` → `anyOf[…, null]` (its documented meaning).
- Unless `strict=True`, two deviations that real traffic shows are accepted (RELAXATIONS):
  error codes outside the `ResponseErrorCode` enum (`context_length_exceeded`,
  `insufficient_quota`, …) and `usage: null` on in-progress/failed `Response` snapshots.

The YAML (3 MB) takes about a second to parse, so its converted `components` are cached as
JSON under the temp dir, keyed by the spec file's path, size and mtime; in one process
everything is parsed once. The spec is found at $CTPROXY_OPENAPI_SPEC or the shared compat copy.
"""

from __future__ import annotations

import copy
import hashlib
import os
import tempfile
from collections.abc import Iterable
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

import orjson
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match

from tests.support.shared import shared_path

SPEC_ENV = "CTPROXY_OPENAPI_SPEC"
DEFAULT_SPEC = shared_path("compat", "openai-openapi", "openapi.yaml")
_CACHE_FORMAT = 2  # bump when the conversion below changes

# What a request may leave out that the shared shape requires: the description's own request shapes
# (`FunctionToolParam` requires only name and type, `InputImageContentParamAutoParam` only type) say so, but
# `CreateResponse` still refers to the response-side `FunctionTool` and `InputImageContent` (issue 44).
REQUEST_OPTIONAL = {"FunctionTool": ("strict", "parameters"), "InputImageContent": ("detail",)}

RELAXATIONS = {
    "ResponseErrorCode": "any string: real streams carry codes the enum lacks (context_length_exceeded, …)",
    "Response.usage": "nullable: response.created/in_progress/failed snapshots carry usage: null",
}


class SpecUnavailable(RuntimeError):
    """The OpenAPI file is not where we look for it."""


class SchemaViolation(AssertionError):
    """A payload does not match its schema. The message names the path and the problem."""

    def __init__(self, schema_name: str, problems: list[str]):
        self.schema_name = schema_name
        self.problems = problems
        super().__init__(
            f"{schema_name}: {problems[0]}" + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else "")
        )


def spec_path() -> Path:
    return Path(os.environ.get(SPEC_ENV) or DEFAULT_SPEC)


def spec_available() -> bool:
    return spec_path().is_file()


# ---- loading and conversion --------------------------------------------------------------------


def _convert(node: Any) -> Any:
    """oneOf → anyOf and `nullable: true` → anyOf[…, null], recursively, into a new structure."""
    if isinstance(node, dict):
        out = {("anyOf" if k == "oneOf" else k): _convert(v) for k, v in node.items() if k != "nullable"}
        if node.get("nullable") is True:
            return {"anyOf": [out, {"type": "null"}]}
        return out
    if isinstance(node, list):
        return [_convert(v) for v in node]
    if isinstance(node, int) and not isinstance(node, bool) and abs(node) >= 2**63:
        return float(node)  # JSON caches hold 64-bit ints; a bound this large is the same as a float
    return node


def _cache_file(path: Path) -> Path:
    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}:{_CACHE_FORMAT}".encode()).hexdigest()
    return Path(tempfile.gettempdir()) / f"ctproxy-openapi-{os.getuid()}" / f"{key[:24]}.json"


def _parse_yaml(path: Path) -> dict[str, Any]:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with path.open("rb") as fh:
        return yaml.load(fh, Loader=loader)


@lru_cache(maxsize=1)
def _components() -> dict[str, Any]:
    """The spec's `components`, converted (oneOf/nullable), from the JSON cache when possible."""
    path = spec_path()
    if not path.is_file():
        raise SpecUnavailable(f"OpenAPI spec not found at {path} (set ${SPEC_ENV})")
    cache = _cache_file(path)
    try:
        return orjson.loads(cache.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        pass
    components = _convert(_parse_yaml(path)["components"])
    data = orjson.dumps(components, option=orjson.OPT_NON_STR_KEYS)  # YAML dates become ISO strings
    try:
        cache.parent.mkdir(mode=0o700, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, cache)  # atomic: concurrent test processes never read a torn file
    except OSError:
        pass  # a read-only temp dir only costs speed
    return orjson.loads(data)


@lru_cache(maxsize=3)
def components(strict: bool = False, request: bool = False) -> dict[str, Any]:
    comps = _components()
    if strict:
        return comps
    schemas = dict(comps["schemas"])
    if request:  # a request's shapes (REQUEST_OPTIONAL)
        for name, optional in REQUEST_OPTIONAL.items():
            shape = dict(schemas[name])
            shape["required"] = [k for k in shape.get("required", []) if k not in optional]
            schemas[name] = shape
    schemas["ResponseErrorCode"] = {"type": "string", "description": RELAXATIONS["ResponseErrorCode"]}
    response = copy.deepcopy(schemas["Response"])
    for part in response.get("allOf", []):
        props = part.get("properties", {})
        if "usage" in props:
            props["usage"] = {"anyOf": [props["usage"], {"type": "null"}]}
    schemas["Response"] = response
    return {**comps, "schemas": schemas}


def schema_names() -> list[str]:
    return sorted(components()["schemas"])


@cache
def _validator(schema_name: str, strict: bool, request: bool = False) -> Draft202012Validator:
    comps = components(strict, request)
    if schema_name not in comps["schemas"]:
        raise KeyError(f"no schema named {schema_name!r} in the OpenAPI components")
    # A tiny root whose `components` is the shared (not copied) dict, so `#/components/…` resolves.
    return Draft202012Validator({"$ref": f"#/components/schemas/{schema_name}", "components": comps})


# ---- validation --------------------------------------------------------------------------------


def _describe(error: ValidationError) -> str:
    message = error.message if len(error.message) <= 300 else error.message[:297] + "..."
    return f"at {error.json_path}: {message}"


def schema_errors(schema_name: str, instance: Any, *, strict: bool = False, request: bool = False) -> list[str]:
    """Readable problems, most relevant first; [] when the instance is valid. `request`: a request body, whose
    function tools and images may leave out what a response always has (REQUEST_OPTIONAL)."""
    errors = list(_validator(schema_name, strict, request).iter_errors(instance))
    if not errors:
        return []
    best = best_match(errors)
    rest = [e for e in errors if e is not best]
    return [_describe(best), *(_describe(e) for e in rest)]


def is_valid(schema_name: str, instance: Any, *, strict: bool = False) -> bool:
    """Whether `instance` matches; stops at the first problem (`schema_errors` on an invalid instance walks
    every `anyOf` branch of every item, which can take minutes on a long input)."""
    return _validator(schema_name, strict).is_valid(instance)


def validate(schema_name: str, instance: Any, *, strict: bool = False) -> None:
    """Raise `SchemaViolation` unless `instance` matches `#/components/schemas/<schema_name>`."""
    problems = schema_errors(schema_name, instance, strict=strict)
    if problems:
        raise SchemaViolation(schema_name, problems)


def validate_if_available(schema_name: str, instance: Any) -> None:
    """`validate` where the spec is at hand (shared/ beside the clone); a no-op in a clone without it.
    For tests whose subject is something else and for which the schema check is an extra."""
    if spec_available():
        validate(schema_name, instance)


@lru_cache(maxsize=1)
def stream_event_schemas() -> dict[str, str]:
    """Event `type` → the member schema of `ResponseStreamEvent` that defines it."""
    schemas = components()["schemas"]
    out: dict[str, str] = {}
    for member in schemas["ResponseStreamEvent"]["anyOf"]:
        name = member["$ref"].rsplit("/", 1)[-1]
        enum = schemas[name].get("properties", {}).get("type", {}).get("enum", [])
        for value in enum:
            out[value] = name
    return out


def validate_stream_event(event: dict[str, Any], *, strict: bool = False) -> str:
    """Validate against the specific member schema, then the `ResponseStreamEvent` union.

    Returns the member schema's name. An event type the spec does not define is a violation.
    """
    name = stream_event_schemas().get(str(event.get("type")))
    if name is None:
        raise SchemaViolation("ResponseStreamEvent", [f"unknown event type {event.get('type')!r}"])
    validate(name, event, strict=strict)
    validate("ResponseStreamEvent", event, strict=strict)
    return name


def validate_all(schema_name: str, instances: Iterable[Any], *, strict: bool = False) -> None:
    for index, instance in enumerate(instances):
        problems = schema_errors(schema_name, instance, strict=strict)
        if problems:
            raise SchemaViolation(f"{schema_name}[{index}]", problems)
