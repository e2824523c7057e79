"""The whole chain in a plain mitmdump, as `ctproxy up` runs it (without the tool server):

    mitmdump -s addons/all.py --mode reverse:https://api.openai.com --set ctp_state_dir=…

Options are the `ctp_*` ones every chain module declares (`mitmdump --options` lists them).
"""

from __future__ import annotations

from addons import chain
from addons.chain_addon import ChainAddon

addons = [ChainAddon(chain())]
