"""The documentation: the site builds offline and strictly (a broken link, a page missing from the navigation, a
docstring the API reference cannot render fails it), the README stays short, and its links resolve."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_site_builds_strictly_with_every_page_and_the_api_reference(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "WARNING" not in done.stderr, done.stderr[-3000:]
    pages = {p.stem for p in (ROOT / "docs").glob("*.md")}
    assert pages <= {p.stem for p in tmp_path.glob("*.html")}
    core = (tmp_path / "api" / "core.html").read_text()
    assert "specbench.core.draft" in core and "host_reads" in core  # drawn from the docstrings


def test_the_readme_is_short_and_its_links_resolve():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if "://" not in target:
            assert (ROOT / target).exists(), target


def test_configs_and_code_point_to_pages_that_exist():
    """A comment that sends the reader somewhere names a page that exists, not a README section that moved."""
    places = [*ROOT.glob("conf/**/*.yaml"), *ROOT.glob("specbench/**/*.py"), *ROOT.glob("methods/**/*.py")]
    for path in places:
        text = path.read_text()
        for page in re.findall(r"\bdocs/[\w/.-]+?\.md\b", text):
            assert (ROOT / page).exists(), f"{path.relative_to(ROOT)} names {page}"
        moved = re.findall(r'\bREADME,? "[^"]+"', text)
        assert not moved, f"{path.relative_to(ROOT)} points to README sections {moved}: name the page in docs/"


def test_every_setting_has_a_line_in_the_settings_page():
    """Every top-level key of conf/config.yaml, every hardware key and every model key is documented: a key added
    without its line fails here."""
    from omegaconf import OmegaConf

    from specbench.models.config import MODEL_KEYS

    page = (ROOT / "docs" / "settings.md").read_text()
    assert undocumented(page, MODEL_KEYS) == []
    top = [k for k in OmegaConf.load(ROOT / "conf" / "config.yaml") if k not in ("defaults", "hydra")]
    hardware = {k for p in (ROOT / "conf" / "hardware").glob("*.yaml") for k in OmegaConf.load(p) if k != "defaults"}
    assert undocumented(page, top, "") == []
    assert undocumented(page, sorted(hardware), "hardware.") == []
    assert undocumented(page + "| `model.name=` |", ["new_key"], "model.") == ["model.new_key"]  # the check bites


def test_every_preset_of_every_group_is_named_in_the_settings_page():
    """Each file of conf/<group>/ is a choice a reader can make, so settings.md names it in backticks (an
    experiment's ``_smoke`` twin through the page's `<name>_smoke`); a preset added without its name fails here."""
    page = (ROOT / "docs" / "settings.md").read_text()
    assert unnamed_presets(page) == []
    assert unnamed_presets(page.replace("`vicuna-33b`", "vicuna-33b")) == ["model=vicuna-33b"]  # the check bites


def unnamed_presets(page: str) -> list[str]:
    from specbench.paths import conf_choices

    named = {n for n in re.findall(r"`([^`]+)`", page) if not set("=<>|") & set(n)}
    smoke = "`<name>_smoke`" in page
    return [f"{group}={c}" for group in ("model", "method", "dataset", "hardware", "experiment", "variant", "ablation",
                                         "placement")
            for c in conf_choices(group) if c not in named and not (smoke and c.removesuffix("_smoke") in named)]


def undocumented(page: str, keys, prefix: str = "model.") -> list[str]:
    """The keys that no `` `<prefix><key>=`` or ``, `<prefix><key>=`` names in ``page``'s table."""
    return [prefix + k for k in keys if not re.search(rf"`{re.escape(prefix + k)}(=|`)", page)]


def test_the_method_lists_agree_with_the_registry():
    """README's methods table, the settings page and the methods page each name every method module of
    methods/ (as a preset in backticks), and no `-cpu` preset that conf/method/ lacks."""
    from specbench.paths import conf_choices

    shipped = sorted(p.stem for p in (ROOT / "methods").glob("*.py") if p.stem not in ("__init__", "registry"))
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Methods") : readme.index("## Against llama.cpp")]
    presets = set(conf_choices("method"))
    for name, text in (("README's methods table", table), ("settings.md", (ROOT / "docs" / "settings.md").read_text()),
                       ("methods.md", (ROOT / "docs" / "methods.md").read_text())):
        named = set(re.findall(r"`([a-z0-9_.]+(?:-[a-z0-9_.]+)*)`", text))
        assert set(shipped) <= named, f"{name} lacks {sorted(set(shipped) - named)}"
        stale = {n for n in named if n.split("-")[0] in shipped and n not in presets and n.endswith("-cpu")}
        assert not stale, f"{name} names presets that do not exist: {sorted(stale)}"


def test_every_path_a_page_names_exists():
    """A file the docs, the measurements or bench/README.md name from the repository's root (``tests/…``,
    ``bench/…``, ``specbench/…``, ``methods/…``, ``conf/…``, ``scripts/…``) exists: a moved or deleted file
    leaves no dangling name (the adding-a-method skeleton's own new files aside)."""
    pages = [*(ROOT / "docs").rglob("*.md"), ROOT / "bench" / "README.md", ROOT / "README.md"]
    missing = []
    for page in pages:
        for path in re.findall(r"`((?:tests|bench|specbench|methods|conf|scripts)/[\w./-]+\.(?:py|yaml|md|sh))`",
                               page.read_text()):
            if not (ROOT / path).exists() and "echo" not in path:
                missing.append(f"{page.relative_to(ROOT)}: {path}")
    assert missing == []
