"""The mechanisms' code: what a candidate harness is made of, written as real Python.

One module per library (``math.py``, ``chess.py``, ``search.py``, ``generic.py``). Nothing here is
called: the library's ``render`` copies this code into a candidate module, so what you read here is,
byte for byte, what a candidate runs. Two kinds of code:

* **methods**, in a class named for the mechanism (``ActionVote``: the ``vote`` choice of the ``action``
  slot); each is copied whole, docstring included (``core.code_of``). The class itself is only a
  namespace: its docstring is not rendered.
* **parts**, module-level functions whose body is one piece of a method that the render puts together
  from several (``core.body_of`` and ``core.define``), where a slot's choices combine (math's
  ``parse_action``: how a Python call passes, then the output format's parser). A part's parameters
  are the names its body uses from that method; its docstring says where it goes and is not rendered.

Two names stand in for what only the candidate has, so the code reads (and lints) as written:
``EXAMPLES``, the candidate module's list of solved examples (``core.string_list``), and
``INSTRUCTION``, which the render replaces by the genome's instruction as a literal
(``core.code_of(..., INSTRUCTION=...)``); a library may name more (chess's ``POSITION``). The
candidate imports what it uses of ``re`` and ``harnesses.base`` (``core.module``), as these modules do.

Code with a line over the formatter's length is kept from it (``# fmt: off`` ... ``# fmt: on``, around
the class or part): reformatting would change the candidates the proposer writes.
"""
