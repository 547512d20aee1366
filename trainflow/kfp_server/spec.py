"""Compiled pipeline documents and their root parameters (pure functions, no kfp import).

A compiled KFP pipeline is a YAML (or JSON) ``PipelineSpec``; kfp-kubernetes adds a second YAML
document, the ``PlatformSpec``. Over the REST API a run carries either the plain spec or, when a
platform spec exists, ``{"pipeline_spec": <spec>, "platform_spec": <platform>}`` (kfp's
``_PipelineDoc.to_dict`` in ``sdk/python/kfp/client/client.py``). Root parameters are declared in
``root.inputDefinitions.parameters`` with a ``parameterType`` from ``pipeline_spec.proto``
(``ParameterType.ParameterTypeEnum``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import yaml

from trainflow.kfp_server.errors import invalid_argument

#: ParameterTypeEnum names (kfp-pipeline-spec ``pipeline_spec.proto``) this server accepts as inputs.
_SCALAR_TYPES = {"STRING", "NUMBER_INTEGER", "NUMBER_DOUBLE", "BOOLEAN"}
_JSON_TYPES = {"LIST", "STRUCT"}


@dataclass(frozen=True, slots=True, kw_only=True)
class ParameterDef:
    """One root input parameter of a pipeline.

    Attributes:
        name: parameter name.
        parameter_type: ``STRING``, ``NUMBER_INTEGER``, ``NUMBER_DOUBLE``, ``BOOLEAN``, ``LIST`` or ``STRUCT``.
        default: the compiled default (``None`` when there is none).
        optional: True when the pipeline may run without a value.
    """

    name: str
    parameter_type: str
    default: Any = None
    optional: bool = False


def parse_package_text(text: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Split a compiled pipeline file into (pipeline spec, platform spec or None).

    Args:
        text: YAML (one or two documents) or JSON.

    Returns:
        The ``PipelineSpec`` dict and the merged ``PlatformSpec`` dict (``None`` if absent or empty).

    Raises:
        ApiError: INVALID_ARGUMENT when the text is not a compiled pipeline.
    """
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        raise invalid_argument(f"the pipeline file is not valid YAML or JSON: {err}") from err
    if not docs or not isinstance(docs[0], dict):
        raise invalid_argument("the pipeline file is empty or not a mapping")
    spec = docs[0]
    platform: dict[str, Any] = {}
    for doc in docs[1:]:
        if isinstance(doc, dict):
            platform.update(doc)
    validate_pipeline_spec(spec)
    return spec, (platform or None)


def unwrap_run_spec(obj: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Return (pipeline spec, platform spec) from a run's ``pipeline_spec`` field.

    Raises:
        ApiError: INVALID_ARGUMENT when it is neither a spec nor a spec/platform pair.
    """
    if not isinstance(obj, dict):
        raise invalid_argument("pipeline_spec must be a JSON object")
    if "pipeline_spec" in obj and isinstance(obj["pipeline_spec"], dict):
        spec, platform = obj["pipeline_spec"], obj.get("platform_spec") or None
    else:
        spec, platform = obj, None
    validate_pipeline_spec(spec)
    return spec, platform


def validate_pipeline_spec(spec: dict[str, Any]) -> None:
    """Check the fields this server relies on.

    Raises:
        ApiError: INVALID_ARGUMENT naming the missing field.
    """
    for field in ("pipelineInfo", "root"):
        if not isinstance(spec.get(field), dict):
            raise invalid_argument(f"pipeline spec has no '{field}' (is this a compiled KFP v2 pipeline?)")
    if not spec["pipelineInfo"].get("name"):
        raise invalid_argument("pipeline spec has no pipelineInfo.name")


def pipeline_name(spec: dict[str, Any]) -> str:
    return str(spec["pipelineInfo"]["name"])


def root_parameters(spec: dict[str, Any]) -> dict[str, ParameterDef]:
    """The pipeline's root input parameters, by name, in declaration order."""
    params = (spec.get("root", {}).get("inputDefinitions", {}) or {}).get("parameters", {}) or {}
    out: dict[str, ParameterDef] = {}
    for name, decl in params.items():
        out[name] = ParameterDef(
            name=name,
            parameter_type=str(decl.get("parameterType", "STRING")),
            default=decl.get("defaultValue"),
            optional=bool(decl.get("isOptional", False)) or "defaultValue" in decl,
        )
    return out


def root_artifacts(spec: dict[str, Any]) -> list[str]:
    """Names of root input artifacts (a local run cannot supply them)."""
    arts = (spec.get("root", {}).get("inputDefinitions", {}) or {}).get("artifacts", {}) or {}
    return list(arts)


def coerce_parameters(spec: dict[str, Any], values: dict[str, Any] | None) -> dict[str, Any]:
    """Check run parameters against the pipeline and convert them to the declared types.

    JSON has one number type, so ``3.0`` for a ``NUMBER_INTEGER`` becomes ``3``; strings that
    hold JSON are accepted for ``LIST``/``STRUCT``.

    Args:
        spec: the pipeline spec.
        values: ``runtime_config.parameters`` of the run (may be ``None``).

    Returns:
        Name -> value for every parameter given (defaults are left to the pipeline).

    Raises:
        ApiError: INVALID_ARGUMENT for an unknown name, a missing required parameter or a value
            of the wrong type; the message names the parameter.
    """
    declared = root_parameters(spec)
    values = dict(values or {})
    unknown = sorted(set(values) - set(declared))
    if unknown:
        raise invalid_argument(
            f"unknown pipeline parameter(s) {', '.join(unknown)}; "
            f"the pipeline declares: {', '.join(declared) or '(none)'}"
        )
    missing = [p.name for p in declared.values() if not p.optional and p.name not in values]
    if missing:
        raise invalid_argument(f"missing required pipeline parameter(s): {', '.join(missing)}")
    if arts := root_artifacts(spec):
        raise invalid_argument(f"pipelines with input artifacts ({', '.join(arts)}) cannot run locally")
    return {name: _coerce(declared[name], value) for name, value in values.items()}


def _coerce(param: ParameterDef, value: Any) -> Any:
    kind = param.parameter_type

    def bad() -> Exception:
        return invalid_argument(f"parameter '{param.name}' expects {kind}, got {value!r}")

    if kind == "STRING":
        if isinstance(value, str):
            return value
        raise bad()
    if kind == "BOOLEAN":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise bad()
    if kind == "NUMBER_INTEGER":
        if isinstance(value, bool):
            raise bad()
        if isinstance(value, int):
            return value
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                raise bad() from None
        raise bad()
    if kind == "NUMBER_DOUBLE":
        if isinstance(value, bool):
            raise bad()
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                raise bad() from None
        raise bad()
    if kind in _JSON_TYPES:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise bad() from None
        if kind == "LIST" and isinstance(value, list):
            return value
        if kind == "STRUCT" and isinstance(value, dict):
            return value
        raise bad()
    if kind in _SCALAR_TYPES:  # pragma: no cover - all handled above
        return value
    raise invalid_argument(f"parameter '{param.name}' has type {kind}, which a run cannot set")
