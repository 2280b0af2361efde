"""Gray release rules in Redis (gateway/features/gray.py applies them).

``<prefix>gray-rules`` is a hash rule name -> GrayRule. Rules are few and change rarely, so
the whole hash is the WATCH unit, as for the records of meta.redis_records. A set is a blind
HSET with its ``gray_rule.set`` change; a delete reads the rule in its transaction so that
the ``gray_rule.deleted`` change carries what was removed.
"""

from __future__ import annotations

from meta.change_feed import change
from meta.models import GrayRule
from meta.redis_base import RedisStoreBase
from meta.redis_topology import TopologyView
from meta.serialization import dumps, loads

GRAY_RULES_KEY = "gray-rules"  # after the store's prefix


class GrayRulesMixin(RedisStoreBase):
    @property
    def _gray_rules_key(self) -> str:
        return self._keys.prefix + GRAY_RULES_KEY

    async def set_gray_rule(self, rule: GrayRule) -> None:
        async def body(view: TopologyView) -> None:
            view.tx.write("HSET", self._gray_rules_key, rule.name, dumps(rule))
            view.tx.publish([change("gray_rule.set", rule)])

        await self._transact(body)

    async def delete_gray_rule(self, name: str) -> bool:
        async def body(view: TopologyView) -> bool:
            text = await view.tx.hget(self._gray_rules_key, name)
            if text is None:
                return False
            view.tx.write("HDEL", self._gray_rules_key, name)
            view.tx.publish([change("gray_rule.deleted", loads(GrayRule, text))])
            return True

        return await self._transact(body)

    async def get_gray_rule(self, name: str) -> GrayRule | None:
        key = self._gray_rules_key
        text = await self._read(lambda: self._conn.client.hget(key, name))
        return None if text is None else loads(GrayRule, text)

    async def list_gray_rules(self) -> list[GrayRule]:
        key = self._gray_rules_key
        texts = await self._read(lambda: self._conn.client.hvals(key))
        return sorted((loads(GrayRule, t) for t in texts), key=lambda r: r.name)
