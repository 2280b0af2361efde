"""A real gateway with a few users, and Debian's chromium driven headless by selenium
through chromium-driver (both from apt: Selenium Manager is never asked to download)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import TypeVar

import pika
import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select

from bench.servers import free_port
from tests.harness.processes import GatewayProcess, check_for

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
USERS = {"adm": "administrator", "mgmt": "management"}
PASSWORD = "pw-dash"
QUEUE_ROW = 'tr[data-vhost="/"][data-name="{}"]'
T = TypeVar("T")


def publish(gateway: GatewayProcess, queue: str, bodies: list[bytes]) -> None:
    """Declare ``queue`` (durable) and publish ``bodies`` to it, confirmed, with pika."""
    connection = pika.BlockingConnection(pika.URLParameters(gateway.url))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare(queue, durable=True)
    for body in bodies:
        channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
    connection.close()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    data = tmp_path_factory.mktemp("dashboard") / "data"
    process = GatewayProcess(data, ["--admin-port", str(free_port())]).start()
    for name, tag in USERS.items():
        status, answer = process.admin(
            "PUT", f"/api/users/{name}", {"password": PASSWORD, "tags": tag}
        )
        assert status == 201, answer
        everything = {"configure": ".*", "write": ".*", "read": ".*"}
        status, answer = process.admin("PUT", f"/api/permissions/%2F/{name}", everything)
        assert status == 201, answer
    yield process
    process.stop()


@pytest.fixture(scope="module")
def documented(gateway: GatewayProcess) -> set[tuple[str, str]]:
    """(METHOD, path template) of every route this gateway's API has (some endpoints the
    dashboard uses are added by other work: the page must then show the API's 404)."""
    status, spec = gateway.admin("GET", "/openapi.json", auth=None)
    assert status == 200
    return {(m.upper(), path) for path, methods in spec["paths"].items() for m in methods}


@pytest.fixture(scope="session")
def browser() -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    # The size of a 1366x768 laptop screen; the sandbox needs a non-root user.
    for argument in ("--headless=new", "--window-size=1366,768", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    if os.geteuid() == 0:
        options.add_argument("--no-sandbox")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


class Dashboard:
    """The page as a user sees it: what is displayed, what a click does."""

    def __init__(self, driver: webdriver.Chrome, gateway: GatewayProcess) -> None:
        self.driver = driver
        self.base = f"http://127.0.0.1:{gateway.admin_port}/"

    def open(self, fragment: str = "") -> None:
        self.driver.get(self.base + fragment)

    def login(self, user: str, password: str = PASSWORD) -> None:
        # The last session is forgotten on a page of the same origin that runs none of the
        # app's script: on the app's own page, its check of a saved session could answer
        # after the clear and save the session again (the form then never showed).
        self.driver.get(self.base + "api/health")
        self.driver.execute_script("sessionStorage.clear()")
        self.open()
        # The form shows once the page's script has looked for a session (it may still be
        # showing the last page's state for a moment).
        self.wait(lambda: self.find("#login-user").is_displayed())
        self.find("#login-user").send_keys(user)
        self.find("#login-password").send_keys(password)
        self.find("#login-submit").click()

    def logged_in(self, user: str) -> None:
        self.login(user)
        self.wait(lambda: self.find("#app").is_displayed() and user in self.text("#who"))
        Select(self.find("#refresh")).select_by_value("2")  # new data within 2 s

    def go(self, fragment: str) -> None:
        self.driver.execute_script("location.hash = arguments[0]", fragment)

    def find(self, css: str) -> WebElement:
        return self.driver.find_element(By.CSS_SELECTOR, css)

    def all(self, css: str) -> list[WebElement]:
        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def text(self, css: str) -> str:
        return self.find(css).text

    def errors(self) -> list[str]:
        return [e.text for e in self.all("#errors .error")]

    def accept_confirm(self) -> str:
        """Say OK to the page's confirm() question; returns the question."""
        alert = self.wait(lambda: self.driver.switch_to.alert)
        question = alert.text
        alert.accept()
        return question

    def script_errors(self) -> list[str]:
        """Errors the page's scripts logged since the last call (answers with an error
        status are the API's business, shown in the page: not counted)."""
        return [
            entry["message"]
            for entry in self.driver.get_log("browser")
            if entry["level"] == "SEVERE" and "Failed to load resource" not in entry["message"]
        ]

    def wait(self, probe: Callable[[], T | None], timeout_s: float = 10) -> T:
        return check_for(timeout_s, probe, interval_s=0.05)

    def fill(self, css: str, text: str) -> None:
        """Type ``text`` into the input ``css`` finds (again, if a redraw interrupted it)."""

        def attempt() -> bool:
            field = self.find(css)
            field.clear()
            field.send_keys(text)
            return self.find(css).get_attribute("value") == text

        self.wait(attempt)

    def click(self, css: str) -> None:
        """Click what ``css`` finds once it is there; tables are redrawn every refresh, so a
        button found may be replaced before the click lands: find it again then."""

        def attempt() -> bool:
            try:
                self.find(css).click()
            except StaleElementReferenceException:
                return False
            return True

        self.wait(attempt)


def error_for(dashboard: Dashboard, source: str) -> str:
    """The error the page shows for ``source`` ("METHOD /path"), once it shows one."""
    return dashboard.wait(lambda: next((e for e in dashboard.errors() if source in e), None))


@pytest.fixture
def dashboard(browser: webdriver.Chrome, gateway: GatewayProcess) -> Dashboard:
    return Dashboard(browser, gateway)
