"""Resources the node watches: memory (the high watermark) and the alarms that block publishers."""
