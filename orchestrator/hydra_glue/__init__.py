"""The meeting point with Hydra: composing the config tree with a trial's overrides, where the
tree lives, the plugins' registrations, Hydra's errors said our way, and its private APIs in
one module.
"""
