"""LoRA adapters: which server holds which adapter (:mod:`.holdings`, pure), loading an
adapter where none has it (:mod:`.placement`) and the admin routes that list, load and
unload them by hand (:mod:`.admin`). The affinity scorer and filter stay a scheduling
plugin (epp.scheduling.plugins.lora): they implement scheduling's plugin contracts and
are registered with the built-in plugins, and scheduling sits below this package
(docs/lora.md)."""
