"""The configuration files and JVM command lines of a local RocketMQ.

Heaps are sized for a 2-core machine with a gateway and tests beside it, and the GC is serial
(fewer threads). The name server and mqadmin stop the JIT at C1, which boots sooner; a broker
keeps C2: its timer service compares a 38 MB wheel byte by byte every second, which costs an
idle broker ~28% of a core in C1 code and ~11% in C2 code.
"""

from __future__ import annotations

import os
from pathlib import Path

from localcluster.ports import HOST
from localcluster.rocketmq.dist import java
from localcluster.rocketmq.layout import CONTROLLER_GROUP, NAMESRV, Layout, Process

NAMESRV_MAIN = "org.apache.rocketmq.namesrv.NamesrvStartup"
BROKER_MAIN = "org.apache.rocketmq.broker.BrokerStartup"
MQADMIN_MAIN = "org.apache.rocketmq.tools.command.MQAdminStartup"

_C1_ONLY = "-XX:TieredStopAtLevel=1"
_JVM_COMMON = [
    "-XX:+UseSerialGC",
    "-Xss512k",
    "-Djava.net.preferIPv4Stack=true",  # listeners in /proc/net/tcp; the HA one IPv4 only
    "-Dtls.server.mode=disabled",  # else each server makes a self-signed key: seconds
    # RocketMQ's shaded logback prints its whole configuration to stdout otherwise.
    "-Dlogback.statusListenerClass="
    "org.apache.rocketmq.logging.ch.qos.logback.core.status.NopStatusListener",
    "--add-opens=java.base/java.lang=ALL-UNNAMED",  # the controller's Hessian serializer
]
NAMESRV_HEAP = ["-Xms64m", "-Xmx128m", _C1_ONLY]
# Direct memory: the broker's send threads each hold an encoding buffer of maxMessageSize.
BROKER_HEAP = ["-Xms256m", "-Xmx384m", "-XX:MaxDirectMemorySize=512m"]
_BROKER_PROPS = [
    # A request frame may hold a message of maxMessageSize (the default frame cap is 16 MiB).
    "-Dcom.rocketmq.remoting.frameMaxLength=268435456",
    # Defaults 0.90 and 0.85 of the disk: a fullish CI disk would make the broker refuse writes.
    "-Drocketmq.broker.diskSpaceWarningLevelRatio=0.98",
    "-Drocketmq.broker.diskSpaceCleanForciblyRatio=0.97",
]
MQADMIN_HEAP = ["-Xms32m", "-Xmx128m", _C1_ONLY]

# The gateway's store contract holds records of 16 MiB and their properties; a larger
# maxMessageSize costs direct memory per send thread (above).
_MAX_MESSAGE = 32 * 1024 * 1024
_COMMITLOG_FILE = 128 * 1024 * 1024


def _properties(values: dict[str, object]) -> str:
    return "".join(f"{key}={value}\n" for key, value in values.items())


def namesrv_conf(layout: Layout) -> str:
    ns = layout.namesrv
    values: dict[str, object] = {"listenPort": ns.ports["listen"], "bindAddress": HOST}
    if "controller" in ns.ports:
        # The controller embedded in the name server: one JVM fewer. It serves brokers and
        # mqadmin on its Raft port, which binds the peer's address (loopback).
        values |= {
            "enableControllerInNamesrv": "true",
            "controllerDLegerGroup": CONTROLLER_GROUP,
            "controllerDLegerPeers": f"n0-{HOST}:{ns.ports['controller']}",
            "controllerDLegerSelfId": "n0",
            "controllerStorePath": str(Path(ns.dir) / "controller"),
            "enableElectUncleanMaster": "false",  # only an in-sync replica may lead
            "notifyBrokerRoleChanged": "true",
        }
    return _properties(values)


def broker_conf(layout: Layout, broker: Process) -> str:
    store = Path(broker.dir) / "store"
    values: dict[str, object] = {
        "brokerClusterName": layout.cluster,
        "brokerName": layout.broker_name,
        "listenPort": broker.ports["listen"],
        "haListenPort": broker.ports["ha"],
        "bindAddress": HOST,
        "brokerIP1": HOST,
        "brokerIP2": HOST,  # the address a master gives its slaves for HA: else the LAN one
        "namesrvAddr": layout.namesrv.address,
        "storePathRootDir": store,
        "storePathCommitLog": store / "commitlog",
        "flushDiskType": "SYNC_FLUSH",
        "autoCreateTopicEnable": "false",
        "autoCreateSubscriptionGroup": "false",
        "enableLmq": "true",
        "enableMultiDispatch": "true",
        "maxMessageSize": _MAX_MESSAGE,
        "mappedFileSizeCommitLog": _COMMITLOG_FILE,  # a message must fit in one file
        # A pull answers up to this (defaults 32 messages, 256 KiB): the gateway reads in
        # batches of hundreds.
        "maxTransferCountOnMessageInMemory": 1024,
        "maxTransferBytesOnMessageInMemory": 4 << 20,
        "diskMaxUsedSpaceRatio": 95,
        # Where the broker saves settings changed at run time (`up` nudges one, mqadmin
        # updateBrokerConfig too): else it rewrites this file with every setting it has.
        "brokerConfigPath": Path(broker.dir) / "runtime.properties",
    }
    if layout.controller is None:
        values["brokerId"] = 0
    else:  # the controller assigns ids and elects the master; a send waits for the in-sync set
        values |= {
            "enableControllerMode": "true",
            "controllerAddr": layout.controller,
            "allAckInSyncStateSet": "true",
            # An idle slave reports its offset this often (default 5 s): only then does the
            # master add it to the sync state set, which makes it electable.
            "haSendHeartbeatInterval": 1000,
            # How soon a slave learns its master's HA address if the role change did not say.
            "syncBrokerMetadataPeriod": 1000,
        }
    return _properties(values)


def write_confs(layout: Layout) -> None:
    layout.rocketmq_home.mkdir(parents=True, exist_ok=True)
    for process in layout.processes:
        Path(process.home).mkdir(parents=True, exist_ok=True)
        text = namesrv_conf(layout) if process.role == NAMESRV else broker_conf(layout, process)
        Path(process.conf).write_text(text)


def _jvm(lib: str, home: str, heap: list[str]) -> list[str]:
    return [java(), *heap, *_JVM_COMMON, f"-Duser.home={home}", "-cp", f"{lib}/*"]


def command(layout: Layout, process: Process) -> list[str]:
    if process.role == NAMESRV:
        return [*_jvm(layout.lib, process.home, NAMESRV_HEAP), NAMESRV_MAIN, "-c", process.conf]
    jvm = _jvm(layout.lib, process.home, BROKER_HEAP)
    return [*jvm, *_BROKER_PROPS, BROKER_MAIN, "-c", process.conf]


def mqadmin_command(layout: Layout, *args: str) -> list[str]:
    """RocketMQ's admin tool against this name server: ``mqadmin_command(l, "clusterList")``.
    Commands that take the controller (``-a``) get it from ``layout.controller``."""
    jvm = _jvm(layout.lib, str(layout.dir / "mqadmin-home"), MQADMIN_HEAP)
    return [*jvm, MQADMIN_MAIN, *args, "-n", layout.namesrv.address]


def environment(layout: Layout) -> dict[str, str]:
    return {**os.environ, "ROCKETMQ_HOME": str(layout.rocketmq_home)}
