"""xDS served by the EPP to Envoy (EDS for the model-server cluster)."""
