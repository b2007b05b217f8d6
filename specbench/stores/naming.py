"""Which store a method's ``datastore`` setting names, the command that builds it, and the checks a run makes
before reading it (it exists; the run's prompts are not among those it was generated from)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specbench import data
from specbench.errors import ConfigError
from specbench.paths import cache_root, setting
from specbench.stores.datastore import BUILD_HINT, META, prompt_hash, read_meta

REFINED_SUFFIX = "-refined"
RANDOM_SUFFIX = "-random"  # the matched-size random control of a refined store
AUTO = "auto"  # ``datastore: auto``: the paper's corpus for the model's domain (:func:`choose_store`)
DOMAIN_CORPORA = {"chat": "ultrachat", "code": "the-stack-python"}  # SPECTRA's and REST's corpora
OFFLINE_CORPUS = "stdlib"  # what every machine has


def stores_root() -> Path:
    """Where named stores live: ``$SPECBENCH_CACHE/datastores`` (default ``~/.cache/specbench/datastores``)."""
    return cache_root() / "datastores"


def is_path_spec(spec: str) -> bool:
    return any(c in spec for c in "/\\") or spec.startswith((".", "~"))


def resolve_store(spec: str, model_cfg: Any, *, refined: bool = False) -> Path:
    """A method's ``datastore`` setting -> a store directory.

    A path (it contains a slash, or starts with ``.`` or ``~``) is used as is; a plain name
    resolves to ``<stores_root>/<model name>/<name>``. ``refined`` names the perplexity-refined
    store built from it (``<name>-refined`` beside it).
    """
    spec = str(spec)
    path = Path(spec).expanduser() if is_path_spec(spec) else stores_root() / str(setting(model_cfg, "name")) / spec
    return path.with_name(path.name + REFINED_SUFFIX) if refined else path


def choose_store(model_cfg: Any, *, refined: bool = False) -> tuple[str, str]:
    """``datastore: auto`` -> (store name, what was chosen and why, for the run's first lines and its rows).

    The paper's corpus for the model's ``domain`` (UltraChat for chat models, The Stack's Python for code
    models) when it is built already or the hub can stream it; else the standard library, named as a fallback.
    """
    from specbench.stores.corpus import hub_problem

    domain = str(setting(model_cfg, "domain", None) or "chat")
    corpus = DOMAIN_CORPORA[domain]
    built = any((resolve_store(corpus, model_cfg, refined=r) / META).exists() for r in {refined, False})
    problem = None if built else hub_problem(corpus)
    if problem is None:
        return corpus, f"auto -> {corpus} ({domain} model)"
    return OFFLINE_CORPUS, f"auto -> {OFFLINE_CORPUS}, a fallback: {corpus} ({domain} model) unavailable, {problem}"


def resolve_auto_store(cfg: Any) -> str:
    """Replace a method's ``datastore: auto`` in the run config by the store :func:`choose_store` picks,
    before the config is hashed (an offline run hashes as ``datastore=stdlib``). Returns the choice, for
    the run's first lines when it is a fallback and for its rows ("" for any other setting)."""
    method = cfg.method
    if str(method.get("datastore", None)) != AUTO:
        return ""
    method.datastore, choice = choose_store(cfg.model, refined=bool(method.get("refine", False)))
    return choice


def build_command(spec: str, model_cfg: Any, *, refined: bool = False) -> str:
    """The one command that builds the store a method's ``datastore`` setting names (a hub corpus: the
    paper's ~100k sequences of it, as a run would build)."""
    from specbench.stores.corpus import HUB_PRESETS

    model = str(setting(model_cfg, "name"))
    hub = HUB_PRESETS.get(spec)
    if refined:
        if is_path_spec(spec):
            return f"specbench datastore refine --model {model} --store {spec}"
        return f"make datastore-refine MODEL={model} STORE={spec}" + (f" SAMPLE={hub.records}" if hub else "")
    if is_path_spec(spec):
        return f"specbench datastore build --model {model} --source <stdlib|dir:DIR|file:FILE|hub:ID|generate:DATASET> --out {spec}"
    return BUILD_HINT.format(model=model, source=spec) + (f" LIMIT={hub.records}" if hub else "")


def check_store(spec: str, model_cfg: Any, run_cfg: Any = None, *, refined: bool = False,
                allow_overlap: bool = False) -> Path:
    """For ``Drafter.preflight``: the store exists (else one line naming the build command), and the
    run's prompts are not among those the store was generated from (unless ``allow_overlap``).
    Returns the store's directory."""
    path = resolve_store(spec, model_cfg, refined=refined)
    meta = read_meta(path, build_command(spec, model_cfg, refined=refined))
    if run_cfg is not None and not allow_overlap and meta.get("prompts"):
        check_overlap(meta, run_cfg, path)
    return path


def run_prompt_hashes(run_cfg: Any) -> dict[str, str]:
    """prompt hash -> sample id, for every turn of the samples a run will evaluate (no model needed)."""
    dcfg = run_cfg.dataset
    ddef = data.get_dataset(str(dcfg.name))
    samples = data.select(ddef.load(dcfg), limit=setting(run_cfg, "limit"), offset=int(setting(run_cfg, "offset", 0)),
                          shuffle=bool(setting(dcfg, "shuffle", False)), seed=int(setting(run_cfg, "seed", 0)))
    return {prompt_hash(turn): f"{ddef.name}/{s.sample_id}" for s in samples for turn in s.turns}


def check_overlap(meta: dict, run_cfg: Any, path: Path) -> None:
    """Refuse a run that evaluates prompts the store was generated from."""
    recorded = set(meta["prompts"].get("hashes", []))
    run = run_prompt_hashes(run_cfg)
    shared = sorted({sid for h, sid in run.items() if h in recorded})
    if shared:
        shown = ", ".join(shared[:4]) + (" …" if len(shared) > 4 else "")
        raise ConfigError(
            f"datastore {path} holds model outputs for {len(shared)} of this run's prompts ({shown}): evaluate "
            f"other samples (offset=/limit=), use another store, or set method.allow_overlap=true to run anyway"
        )


def prepare_store(method: str, config: Any, run_cfg: Any, *, refined: bool = False) -> None:
    """For a method's ``preflight``: check the store its ``datastore`` setting names (:func:`check_store`)
    and note on ``config`` where the drafter will find it and how it is built (not dataclass fields:
    results record the setting, not the path). A missing named store that the run can build within
    ``build_budget`` is planned instead (``config._store_build``, :mod:`specbench.stores.ondemand`)."""
    if str(config.datastore) == AUTO:  # a preflight outside plan(), which resolves it first
        config.datastore, config._store_choice = choose_store(run_cfg.model, refined=refined)
    spec = str(config.datastore)
    path = resolve_store(spec, run_cfg.model, refined=refined)
    config._store_hint = build_command(spec, run_cfg.model, refined=refined)
    config._store_build = None
    if not (path / META).exists() and not is_path_spec(spec):
        from specbench.stores.ondemand import plan_build

        parent = resolve_store(spec, run_cfg.model)
        command = " && ".join(([] if (parent / META).exists() else [build_command(spec, run_cfg.model)])
                              + ([config._store_hint] if refined else []))
        config._store_build = plan_build(
            method, spec, run_cfg.model, parent, path if refined else None, device=str(setting(run_cfg.hardware, "device")),
            budget_s=float(setting(run_cfg, "build_budget", 600) or 0), command=command)
        config._store_path = str(path)
        return
    path = check_store(spec, run_cfg.model, run_cfg, refined=refined,
                       allow_overlap=bool(getattr(config, "allow_overlap", False)))
    config._store_path = str(path)


def open_store(method: str, config: Any, tokenizer: Any, *, refined: bool = False):
    """The store a drafter reads: where :func:`prepare_store` found it, or the path ``datastore`` names."""
    from specbench.stores.datastore import Datastore

    path = getattr(config, "_store_path", None)
    if path is None:
        if not is_path_spec(str(config.datastore)):
            raise ConfigError(f"{method}: datastore '{config.datastore}' is a name; the runner resolves "
                              "it for the model (or pass a path)")
        path = resolve_store(config.datastore, None, refined=refined)
    return Datastore.load(path, tokenizer, hint=getattr(config, "_store_hint", None))
