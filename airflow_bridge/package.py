"""Compiled KFP pipeline packages, read without kfp (pure functions; PyYAML only).

A package is what ``kfp dsl compile`` (or ``trainflow compile``) writes: a YAML ``PipelineSpec``,
optionally followed by a second YAML document, the ``PlatformSpec`` that kfp-kubernetes emits
(secrets, tolerations, node selectors...). ``.json`` and the ``.tar.gz``/``.tgz``/``.zip``
archives kfp's client accepts (holding ``pipeline.yaml`` or a single ``*.yaml``) are read too.

Sent to the API, a package becomes the run's ``pipeline_spec`` field: the plain spec, or
``{"pipeline_spec": spec, "platform_spec": platform}`` when there is a platform document -- the
same shape kfp's client builds (``_PipelineDoc.to_dict`` in ``sdk/python/kfp/client/client.py``).
"""

from __future__ import annotations

import copy
import json
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from airflow_bridge.exceptions import KfpPackageError

#: ``parameterType`` (pipeline_spec.proto ``ParameterTypeEnum``) -> JSON-schema type, for Airflow Params.
JSON_SCHEMA_TYPES = {
    "STRING": "string",
    "NUMBER_INTEGER": "integer",
    "NUMBER_DOUBLE": "number",
    "BOOLEAN": "boolean",
    "LIST": "array",
    "STRUCT": "object",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineParameter:
    """One root input parameter.

    Attributes:
        name: parameter name.
        parameter_type: ``STRING``, ``NUMBER_INTEGER``, ``NUMBER_DOUBLE``, ``BOOLEAN``, ``LIST`` or ``STRUCT``.
        default: the compiled default, converted to the declared type (``None`` if there is none).
        optional: True when the pipeline may run without a value.
        description: from the pipeline's docstring, if the compiler recorded one.
    """

    name: str
    parameter_type: str
    default: Any = None
    optional: bool = False
    description: str = ""

    @property
    def json_schema_type(self) -> str:
        return JSON_SCHEMA_TYPES.get(self.parameter_type, "string")


def _typed_default(parameter_type: str, value: Any) -> Any:
    # YAML writes integer defaults as 1.0 (protobuf Value has one number type).
    if parameter_type == "NUMBER_INTEGER" and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


@dataclass(frozen=True, slots=True)
class PipelinePackage:
    """A compiled pipeline: the ``PipelineSpec`` and, if present, the ``PlatformSpec``."""

    pipeline_spec: dict[str, Any]
    platform_spec: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return str(self.pipeline_spec["pipelineInfo"]["name"])

    @property
    def parameters(self) -> dict[str, PipelineParameter]:
        """Root input parameters by name (in the order of the compiled file; kfp sorts them by name)."""
        decls = (self.pipeline_spec.get("root", {}).get("inputDefinitions", {}) or {}).get(
            "parameters", {}
        ) or {}
        out = {}
        for name, decl in decls.items():
            ptype = str(decl.get("parameterType", "STRING"))
            out[name] = PipelineParameter(
                name=name,
                parameter_type=ptype,
                default=_typed_default(ptype, decl.get("defaultValue")),
                optional=bool(decl.get("isOptional")) or "defaultValue" in decl,
                description=str(decl.get("description") or ""),
            )
        return out

    def prepare_arguments(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Check run arguments against the declared parameters and convert them to their types.

        Templated values arrive as strings ("3", "0.01", "true", "[1, 2]"); they are converted to
        the declared ``parameterType`` so the API receives typed JSON.

        Returns:
            A new dict with converted values.

        Raises:
            KfpPackageError: for unknown names, missing required ones, or values that do not
                convert; the message names them and lists the declared parameters.
        """
        declared = self.parameters
        unknown = sorted(set(arguments) - set(declared))
        if unknown:
            raise KfpPackageError(
                f"pipeline '{self.name}' has no parameter(s) {', '.join(unknown)}; "
                f"it declares: {', '.join(declared) or '(none)'}"
            )
        missing = [p.name for p in declared.values() if not p.optional and p.name not in arguments]
        if missing:
            raise KfpPackageError(f"pipeline '{self.name}' needs parameter(s) {', '.join(missing)}")
        converted = {name: convert_argument(declared[name], value) for name, value in arguments.items()}
        for name in sorted(self.secret_name_parameters() & set(declared)):
            if converted.get(name, declared[name].default) == "":
                raise KfpPackageError(
                    f"pipeline '{self.name}': parameter {name!r} names the Kubernetes Secret its tasks read "
                    "(compiled with kfp-kubernetes) and cannot be empty: Kubernetes refuses a pod whose "
                    "secretKeyRef has no name, so every task would fail before it starts; give the Secret's "
                    "name, or use a package compiled without the Secret"
                )
        return converted

    def secret_name_parameters(self) -> set[str]:
        """Input parameters that name a Kubernetes Secret a task reads
        (``secretAsEnv[].secretNameParameter.componentInputParameter`` of the kfp-kubernetes
        platform document, ``use_secret_as_env(secret_name=<a pipeline parameter>)``)."""
        executors = (((self.platform_spec or {}).get("platforms") or {}).get("kubernetes") or {}).get(
            "deploymentSpec", {}).get("executors") or {}
        names = set()
        for config in executors.values():
            for secret in (config or {}).get("secretAsEnv") or []:
                ref = (secret.get("secretNameParameter") or {}).get("componentInputParameter")
                if ref:
                    names.add(str(ref))
        return names

    def uncached_tasks(self) -> list[str]:
        """Names of the step tasks compiled not to cache (``cachingOptions.enableCache`` false or
        absent: proto3 JSON omits ``false``), in the root DAG and in every sub-DAG, in spec order.

        A task that runs a sub-DAG (a ``dsl.If`` condition, a ``dsl.ParallelFor``) is not a step and
        is not listed; its steps are.
        """
        components = self.pipeline_spec.get("components") or {}
        dags = [self.pipeline_spec.get("root", {}).get("dag")]
        dags += [c.get("dag") for c in components.values() if isinstance(c, dict)]
        names = []
        for dag in dags:
            for name, task in ((dag or {}).get("tasks") or {}).items():
                component = components.get(((task or {}).get("componentRef") or {}).get("name"), {})
                runs_a_dag = isinstance(component, dict) and "dag" in component
                if not runs_a_dag and not ((task or {}).get("cachingOptions") or {}).get("enableCache"):
                    names.append(str(name))
        return names

    def api_pipeline_spec(self, *, enable_caching: bool | None = None) -> dict[str, Any]:
        """The run's ``pipeline_spec`` field, optionally with caching forced on or off.

        Args:
            enable_caching: ``None`` keeps the compiled settings; a bool overrides every task's
                ``cachingOptions.enableCache``: the root DAG's, as kfp's client does client-side
                (``_override_caching_options``), and those of every sub-DAG (a ``dsl.If`` branch,
                a ``dsl.ParallelFor`` body), which kfp's client leaves as compiled.
        """
        spec = copy.deepcopy(self.pipeline_spec)
        if enable_caching is not None:
            dags = [spec.get("root", {}).get("dag")]
            dags += [c.get("dag") for c in (spec.get("components") or {}).values() if isinstance(c, dict)]
            for dag in dags:
                for task in ((dag or {}).get("tasks") or {}).values():
                    task.setdefault("cachingOptions", {})["enableCache"] = bool(enable_caching)
        if self.platform_spec:
            return {"pipeline_spec": spec, "platform_spec": copy.deepcopy(self.platform_spec)}
        return spec


def convert_argument(param: PipelineParameter, value: Any) -> Any:
    """Convert one argument to the parameter's declared type (strings are parsed).

    Raises:
        KfpPackageError: naming the parameter, its type and the value.
    """
    kind = param.parameter_type

    def bad() -> KfpPackageError:
        return KfpPackageError(f"parameter '{param.name}' expects {kind}, got {value!r}")

    if kind == "STRING":
        return value if isinstance(value, str) else str(value)
    if kind == "BOOLEAN":
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("true", "1", "yes"):
            return True
        if text in ("false", "0", "no"):
            return False
        raise bad()
    if kind == "NUMBER_INTEGER":
        if isinstance(value, bool):
            raise bad()
        if isinstance(value, int):
            return value
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise bad() from None
        if not number.is_integer():
            raise bad()
        return int(number)
    if kind == "NUMBER_DOUBLE":
        if isinstance(value, bool):
            raise bad()
        try:
            return float(value)
        except (TypeError, ValueError):
            raise bad() from None
    if kind in ("LIST", "STRUCT"):
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise bad() from None
        if (kind == "LIST" and isinstance(value, list)) or (kind == "STRUCT" and isinstance(value, dict)):
            return value
        raise bad()
    return value


def parse_pipeline_package(text: str, *, source: str = "<text>") -> PipelinePackage:
    """Parse the text of a compiled pipeline (YAML, one or more documents, or JSON).

    Raises:
        KfpPackageError: when it is not a compiled KFP v2 pipeline; the message names ``source``.
    """
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        raise KfpPackageError(f"{source} is not valid YAML/JSON: {err}") from err
    if not docs or not isinstance(docs[0], dict):
        raise KfpPackageError(f"{source} is empty or not a YAML mapping")
    spec = docs[0]
    if not isinstance(spec.get("pipelineInfo"), dict) or not isinstance(spec.get("root"), dict):
        raise KfpPackageError(
            f"{source} is not a compiled KFP v2 pipeline (no pipelineInfo/root); compile it with "
            "`kfp dsl compile` or `trainflow compile`"
        )
    platform: dict[str, Any] = {}
    for doc in docs[1:]:
        if isinstance(doc, dict):
            platform.update(doc)
    return PipelinePackage(spec, platform or None)


def package_from_api_spec(spec: Any, *, source: str) -> PipelinePackage:
    """The package of a pipeline version as the KFP API returns it (``V2beta1PipelineVersion``'s
    ``pipeline_spec``: the ``PipelineSpec``, or ``{"pipeline_spec", "platform_spec"}`` for a file
    with a kfp-kubernetes platform document).

    Raises:
        KfpPackageError: it holds no compiled KFP v2 pipeline; the message names ``source``.
    """
    if isinstance(spec, dict) and "pipelineInfo" not in spec and isinstance(spec.get("pipeline_spec"), dict):
        spec, platform = spec["pipeline_spec"], spec.get("platform_spec")
    else:
        platform = None
    if not isinstance(spec, dict) or not isinstance(spec.get("pipelineInfo"), dict):
        raise KfpPackageError(f"{source} holds no compiled KFP v2 pipeline spec")
    return PipelinePackage(spec, platform if isinstance(platform, dict) and platform else None)


def _from_archive_members(names: list[str], source: str) -> str:
    yamls = [n for n in names if n.endswith((".yaml", ".yml"))]
    if "pipeline.yaml" in yamls:
        return "pipeline.yaml"
    if len(yamls) == 1:
        return yamls[0]
    raise KfpPackageError(
        f"{source} must hold pipeline.yaml or exactly one .yaml file, found {yamls or 'none'}"
    )


def load_pipeline_package(path: str | Path) -> PipelinePackage:
    """Read a compiled pipeline file (``.yaml``, ``.yml``, ``.json``, ``.tar.gz``, ``.tgz``, ``.zip``).

    Raises:
        KfpPackageError: when the file is missing, of another kind, or not a compiled pipeline.
    """
    path = Path(path)
    source = str(path)
    if not path.is_file():
        raise KfpPackageError(f"pipeline package {source} does not exist")
    name = path.name.lower()
    try:
        if name.endswith((".tar.gz", ".tgz")):
            with tarfile.open(path, "r:gz") as tar:
                member = _from_archive_members([m.name for m in tar if m.isfile()], source)
                handle = tar.extractfile(member)
                assert handle is not None
                text = handle.read().decode()
        elif name.endswith(".zip"):
            with zipfile.ZipFile(path) as archive:
                text = archive.read(_from_archive_members(archive.namelist(), source)).decode()
        elif name.endswith((".yaml", ".yml", ".json")):
            text = path.read_text()
        else:
            raise KfpPackageError(
                f"{source}: a pipeline package ends in .yaml, .yml, .json, .tar.gz, .tgz or .zip"
            )
    except (OSError, tarfile.TarError, zipfile.BadZipFile, UnicodeDecodeError) as err:
        raise KfpPackageError(f"cannot read pipeline package {source}: {err}") from err
    if name.endswith(".json"):
        try:
            spec = json.loads(text)
        except ValueError as err:
            raise KfpPackageError(f"{source} is not valid JSON: {err}") from err
        text = yaml.safe_dump(spec)
    return parse_pipeline_package(text, source=source)
