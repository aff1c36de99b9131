"""An agent's data plane: the objects it holds (``store``) and the port it serves them on
(``server``); see ``zres.core.objects`` and ``zres.core.transfer``."""
