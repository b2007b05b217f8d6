"""The results site in a real browser (headless Chromium, Debian's, through its driver): ``make site-test``.

Built from the smoke results (``make smoke-experiments``): every table has rows, sorting orders a column and
the filters cut rows, the summary reads down with its wide form a click away, a generation's token view renders with its sources' colours, and the console has no
error. Screenshots go to ``reports/site-test/``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from specbench.core.record import TARGET_TOKEN
from specbench.tables.site import write_site

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "results" / "smoke"
SHOTS = ROOT / "reports" / "site-test"


@pytest.fixture(scope="module")
def page():
    webdriver = pytest.importorskip("selenium.webdriver", reason="make site-test installs selenium")
    if not (SMOKE / "table1").is_dir():
        pytest.fail("no smoke results: make smoke-experiments (make site-test runs it)", pytrace=False)
    for tool in ("chromium", "chromedriver"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is missing: apt-get install chromium chromium-driver", pytrace=False)
    index = write_site(SMOKE, SHOTS / "site")
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1500,1100",
                "--allow-file-access-from-files"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(shutil.which("chromedriver")))
    driver.get(index.as_uri())
    yield driver
    driver.quit()


def rows_of(driver, table: str):
    return driver.find_elements("css selector", f'.table-block[data-table="{table}"] tr.row')


def test_every_table_has_rows(page):
    blocks = page.find_elements("css selector", ".table-block")
    names = [b.get_attribute("data-table") for b in blocks]
    assert {"table1", "table2", "table7", "spec_bench", "batch_sweep"} <= set(names)
    for name in names:
        assert rows_of(page, name), f"{name} shows no row"
    published = page.find_elements("css selector", '.table-block[data-table="spec_bench"] td .pub')
    assert published and "/ 1.66" in " ".join(p.text for p in published)  # the shipped leaderboard
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.save_screenshot(str(SHOTS / "tables.png"))


def test_sorting_orders_a_column_and_filters_cut_rows(page):
    header = page.find_element("css selector", '.table-block[data-table="spec_bench"] th[data-col="overall"]')
    col = [h.get_attribute("data-col") for h in page.find_elements(
        "css selector", '.table-block[data-table="spec_bench"] th')].index("overall")

    def overall():
        cells = [r.find_elements("css selector", "td")[col].text for r in rows_of(page, "spec_bench")]
        return [float(c.split()[0]) for c in cells if c and c[0] != "—"]

    header.click()
    up = overall()
    page.find_element("css selector", '.table-block[data-table="spec_bench"] th[data-col="overall"]').click()
    down = overall()
    assert len(up) >= 2 and up == sorted(up) and down == sorted(down, reverse=True) and up != down
    before = len(rows_of(page, "table1"))
    select = page.find_element("id", "filter-method")
    values = [o.get_attribute("value") for o in select.find_elements("css selector", "option")]
    select.find_element("css selector", f'option[value="{values[1]}"]').click()
    after = len(rows_of(page, "table1"))
    assert 0 < after < before
    select.find_element("css selector", 'option[value=""]').click()
    assert len(rows_of(page, "table1")) == before


def test_the_summary_reads_down_and_its_wide_form_is_one_click_away(page):
    """The summary shows a row per preset × dataset (the dataset a column of its own, the metrics beside it);
    its toggle shows the wide form (a column per dataset × metric, a row per preset) and back."""
    block = '.table-block[data-table="summary"]'
    SHOTS.mkdir(parents=True, exist_ok=True)
    heads = [h.get_attribute("data-col") for h in page.find_elements("css selector", f"{block} th")]
    long_rows = len(rows_of(page, "summary"))
    assert "dataset" in heads and "speedup" in heads
    assert page.find_element("css selector", block).get_attribute("data-form") == "long"
    page.find_element("css selector", f"{block} .form-toggle").click()
    wide_heads = [h.get_attribute("data-col") for h in page.find_elements("css selector", f"{block} th")]
    assert "dataset" not in wide_heads and any(h.endswith(" speedup") for h in wide_heads)
    assert len(rows_of(page, "summary")) < long_rows  # the smoke results hold several datasets a preset
    page.save_screenshot(str(SHOTS / "summary-wide.png"))
    page.find_element("css selector", f"{block} .form-toggle").click()
    assert page.find_element("css selector", block).get_attribute("data-form") == "long"
    page.save_screenshot(str(SHOTS / "summary.png"))


def test_a_generation_renders_token_by_token_in_its_sources_colours(page):
    page.find_element("css selector", 'nav button[data-tab="generations"]').click()
    search = page.find_element("id", "generation-search")
    search.send_keys("pld")
    select = page.find_element("id", "generation")
    for option in select.find_elements("css selector", "option"):
        option.click()
        tokens = page.find_elements("css selector", "#tokens .tok")
        sources = {t.get_attribute("data-source") for t in tokens}
        if sources - {TARGET_TOKEN}:
            break
    else:
        pytest.fail("no pld generation with an accepted guess in the smoke results")
    colours = {t.get_attribute("data-source"): t.value_of_css_property("background-color") for t in tokens}
    assert len(set(colours.values())) == len(colours) >= 2  # the target's tokens and drafted ones differ
    assert page.find_elements("css selector", "#source-legend .legend-item")
    assert "τ" in page.find_element("id", "generation-info").text
    steps = {t.get_attribute("data-step") for t in tokens}
    assert len(steps) < len(tokens)  # some step gave several tokens
    page.save_screenshot(str(SHOTS / "tokens.png"))


def test_the_console_has_no_error(page):
    errors = [e for e in page.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
