"""`mqgw broker`: the store served over the broker protocol, alone or in a replicated group."""
