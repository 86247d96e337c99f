"""LoRA adapters: which server holds which adapter (:mod:`.holdings`, pure) and loading
an adapter where none has it (:mod:`.placement`). The affinity scorer is a scheduling
plugin (epp.scheduling.plugins.lora); the admin routes are in epp.admin.lora
(docs/lora.md)."""
