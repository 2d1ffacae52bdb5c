"""What `runstate sql` lets run: one query that reads the `lake` catalog's Iceberg tables, nothing else.

A deny list of what a query must not do misses the next spelling (`TRANSFORM ... USING 'sh'`,
``text.`/etc/shadow` ``, `IDENTIFIER('reflect')(...)`), so the check names what is allowed, and it looks
at the plan Spark's analyser resolved (IDENTIFIER(), functions, tables, CTEs all resolved), which is the
plan that runs. In order:

1. Spark's parser reads the statement: exactly one statement, and no command or statement node anywhere in
   its plan (INSERT, CALL, SET, EXPLAIN, CACHE, ... however wrapped). This comes before the analyser,
   because Spark runs a command as it analyses it.
2. Spark's analyser resolves the query; nothing runs yet. `spark.sql.runSQLOnFiles` is off first, so
   ``csv.`/path` `` names a table of the current catalog (`lake`), not a file: the analyser reads no file
   (it would, to infer a CSV or JSON file's schema).
3. Every node of the analysed plan (children, inner children and the plans of subquery expressions) must
   be on one of these lists, or the query is refused with one line naming the class:
   - PLAN_NODES, the relational operators of a SELECT. Each computes from its children only:
     projection, filter, aggregate, joins (LATERAL too), sort, limit and offset, set operations,
     windows, GROUPING SETS/CUBE/ROLLUP (Expand), explode and LATERAL VIEW (Generate), TABLESAMPLE,
     the aliases and CTE nodes the analyser writes, hints and repartitioning, and the relations that
     read no storage: VALUES (LocalRelation), a SELECT without FROM (OneRowRelation) and range().
     Left out, among others: script transformation (runs a program), every relation over files or
     another catalog (LogicalRelation, HiveTableRelation), views (a temporary view is session state
     this command cannot create), and anything Spark adds after this was written.
   - the one relation: a DataSourceV2Relation whose catalog is `lake` and whose table Iceberg serves
     (org.apache.iceberg.spark.source.SparkTable: a table, its metadata tables such as `.snapshots`,
     and time travel with VERSION/TIMESTAMP AS OF). Not another catalog, `spark_catalog` included.
     Each part of the table's name is a plain identifier (`[A-Za-z_][A-Za-z0-9_]*`), as runstate's
     own tables are: a Hadoop catalog makes a table's folder from its name, so ``lake.`..`.`..`.x``
     would read an Iceberg table outside the warehouse.
   - expressions: Spark's built-in functions, as its FunctionRegistry.builtin ships them (not the
     session's registry, to which a UDF or an extension adds), except reflect and java_method
     (CallMethodViaReflection), which call any Java method their arguments name; plus EXPRESSIONS,
     what the analyser writes itself (columns, aliases, literals, casts, sort orders, window frames,
     subqueries, lambdas, date and interval arithmetic) and what the built-ins made by a builder
     resolve to (explode, ceil, lpad, ...). A user's function in any spelling (a Scala, Python or
     Hive UDF, a catalog's function such as Iceberg's `system.bucket`, which resolve to ScalaUDF,
     PythonUDF, StaticInvoke, Invoke or ApplyFunctionExpression) is on no list.
   A built-in that the analyser rewrites into its implementation (InheritAnalysisRules: `nvl` into
   `coalesce`, `to_date` into a cast) is checked by the arguments the user wrote: the rewrite is
   Spark's own code for that function, which may call Spark's helpers through StaticInvoke.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import click

from runstate.maintenance.identifiers import IDENTIFIER_PATTERN

LOGICAL = "org.apache.spark.sql.catalyst.plans.logical"
EXPR = "org.apache.spark.sql.catalyst.expressions"
AGG = f"{EXPR}.aggregate"
CATALOG = "lake"
# Plan nodes that are not queries: Spark's commands (DDL, DML, SET, CACHE, EXPLAIN, ...) and parsed
# statements (INSERT, and the Iceberg extensions' CALL).
STATEMENT_CLASSES = (f"{LOGICAL}.Command", f"{LOGICAL}.ParsedStatement")
RELATION = "org.apache.spark.sql.execution.datasources.v2.DataSourceV2Relation"
ICEBERG_TABLE = "org.apache.iceberg.spark.source.SparkTable"
# A part of a table's name (namespace levels and name): what runstate's own identifiers allow.
NAME_PART = re.compile(IDENTIFIER_PATTERN, re.ASCII)
# The operators of a read-only query (module docstring): each computes from its children only.
PLAN_NODES = frozenset(
    f"{LOGICAL}.{name}"
    for name in (
        "Project",
        "Filter",
        "Aggregate",
        "Join",
        "LateralJoin",
        "Sort",
        "GlobalLimit",
        "LocalLimit",
        "Offset",
        "Tail",
        "Union",
        "Intersect",
        "Except",
        "Distinct",
        "Deduplicate",
        "Window",
        "Expand",
        "Generate",
        "Sample",
        "SubqueryAlias",
        "WithCTE",
        "CTERelationDef",
        "CTERelationRef",
        "ResolvedHint",
        "RepartitionByExpression",
        "Repartition",
        "RebalancePartitions",
        "LocalRelation",
        "OneRowRelation",
        "Range",
    )
)
# Built-ins left out of the registry's list: they call any Java method named in their arguments.
REFUSED_BUILTINS = frozenset({f"{EXPR}.CallMethodViaReflection"})
# What the analyser writes itself, and what built-ins made by a builder resolve to (the registry names
# the builder, e.g. CeilExpressionBuilder, not what it makes).
EXPRESSIONS = frozenset(
    {
        *(
            f"{EXPR}.{name}"
            for name in (
                # columns, names, constants, types
                "AttributeReference",
                "Alias",
                "Literal",
                "Cast",
                "UpCast",
                "OuterReference",
                # field, item and key access: a.b, a[0], m['k']
                "GetStructField",
                "GetArrayStructFields",
                "GetArrayItem",
                "GetMapValue",
                # subqueries: their plans are checked as plans
                "ScalarSubquery",
                "Exists",
                "InSubquery",
                "ListQuery",
                "LateralSubquery",
                # ORDER BY, windows, lambdas, IN lists
                "SortOrder",
                "WindowExpression",
                "WindowSpecDefinition",
                "SpecifiedWindowFrame",
                "UnspecifiedFrame$",
                "CurrentRow$",
                "UnboundedPreceding$",
                "UnboundedFollowing$",
                "LambdaFunction",
                "NamedLambdaVariable",
                "In",
                "LikeAny",
                "NotLikeAny",
                "LikeAll",
                "NotLikeAll",
                # arithmetic on dates, timestamps and intervals
                "UnaryMinus",
                "TimeAdd",
                "DatetimeSub",
                "DateAddInterval",
                "DateAddYMInterval",
                "TimestampAddYMInterval",
                "SubtractDates",
                "SubtractTimestamps",
                "MultiplyYMInterval",
                "MultiplyDTInterval",
                "DivideYMInterval",
                "DivideDTInterval",
                "TimestampAdd",
                "TimestampDiff",
                # made by built-ins' builders
                "Explode",
                "Ceil",
                "Floor",
                "RoundCeil",
                "RoundFloor",
                "StringLPad",
                "StringRPad",
                "BinaryPad",
                "Mask",
                "StartsWith",
                "EndsWith",
                "Contains",
                "CurrentDate",
                "MakeTimestamp",
                "ParseToTimestamp",
                "Extract",
                "DatePart",
            )
        ),
        *(
            f"{AGG}.{name}"
            for name in ("AggregateExpression", "PivotFirst", "PercentileCont", "PercentileDisc")
        ),
        *(f"{AGG}.{name}" for name in ("Sum", "Average", "CountMinSketchAgg")),  # made by builders
    }
)
INHERIT_ANALYSIS_RULES = f"{EXPR}.InheritAnalysisRules"
SUBQUERY = f"{EXPR}.SubqueryExpression"


class QueryRefused(click.ClickException):
    """The statement is not one read-only query of the lake: nothing was run."""


def read_only_query(spark: Any, statement: str) -> Any:
    """The statement's DataFrame, analysed and not run, if it is one query that passes the allow lists
    (module docstring); QueryRefused otherwise, an analysis error (an unknown table or function) too:
    the analyser runs nothing."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException
    from pyspark.sql import DataFrame

    parsed = _parsed_query(spark, statement)
    spark.conf.set("spark.sql.runSQLOnFiles", "false")  # before the analyser: it would read the file
    jvm = spark.sparkContext._jvm
    try:
        analysed = jvm.org.apache.spark.sql.Dataset.ofRows(spark._jsparkSession, parsed)
    except (PySparkException, Py4JJavaError) as error:
        raise QueryRefused(f"{first_line(error)}; nothing was run") from None
    frame = DataFrame(analysed, spark)
    AllowList(spark).check(frame._jdf.queryExecution().analyzed())
    return frame


def _parsed_query(spark: Any, statement: str) -> Any:
    """The parsed plan of the one statement; QueryRefused when it does not parse or holds a command."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    parser = spark._jsparkSession.sessionState().sqlParser()
    try:
        plan = parser.parsePlan(statement)
    except (PySparkException, Py4JJavaError) as error:  # PySpark makes the parser's errors its own
        raise QueryRefused(f"not one Spark SQL statement: {first_line(error)}; nothing was run") from None
    statements = [_load(spark, name) for name in STATEMENT_CLASSES]
    for node in _plan_nodes(plan):
        if any(kind.isInstance(node) for kind in statements):
            kind = node.getClass().getSimpleName().rstrip("$")
            raise QueryRefused(
                f"only a query may run here (SELECT, WITH ... SELECT, VALUES, TABLE), not {_words(kind)} "
                f"(Spark's {kind}); nothing was run"
            )
    return plan


class AllowList:
    """The allow lists of the module docstring, checked over an analysed plan; `catalog` is the one whose
    tables may be read (`lake`; a test stands a catalog of its own in)."""

    def __init__(self, spark: Any, catalog: str = CATALOG) -> None:
        self._catalog = catalog
        self._builtins = builtin_functions(spark)
        self._inherits = _load(spark, INHERIT_ANALYSIS_RULES)
        self._subquery = _load(spark, SUBQUERY)

    def check(self, plan: Any) -> None:
        pending = [plan]
        while pending:
            node = pending.pop()
            self._check_node(node)
            pending += _seq(node.children()) + _seq(node.innerChildren())
            pending += self._check_expressions(_seq(node.expressions()))

    def _check_node(self, node: Any) -> None:
        kind = node.getClass().getName()
        if kind == RELATION:
            self._check_relation(node)
        elif kind not in PLAN_NODES:
            raise QueryRefused(
                f"the query's plan holds {_simple(kind)} ({kind}), which is not on runstate sql's allow "
                f"list of read-only plan nodes (lake tables, SELECT's operators); nothing was run"
            )

    def _check_relation(self, node: Any) -> None:
        catalog = node.catalog()
        name = catalog.get().name() if catalog.isDefined() else None
        if name != self._catalog or node.table().getClass().getName() != ICEBERG_TABLE:
            raise QueryRefused(
                f"only the {self._catalog} catalog's Iceberg tables may be read here, not "
                f"{node.table().name()} (catalog {name}, {node.table().getClass().getName()}); nothing was run"
            )
        identifier = node.identifier()
        parts = [*identifier.get().namespace(), identifier.get().name()] if identifier.isDefined() else []
        if not parts or not all(NAME_PART.fullmatch(part) for part in parts):
            shown = ".".join(f"`{part}`" for part in parts) or node.table().name()
            raise QueryRefused(
                f"a table of the {self._catalog} catalog is named by plain identifiers "
                f"({IDENTIFIER_PATTERN}, dot-separated), not {shown}; nothing was run"
            )

    def _check_expressions(self, expressions: list[Any]) -> list[Any]:
        """Refuse an expression on no list; the plans of the subqueries among them, to check next."""
        plans, pending = [], list(expressions)
        while pending:
            expression = pending.pop()
            kind = expression.getClass().getName()
            if kind in self._builtins:
                if self._inherits.isInstance(expression):  # check what the user wrote, not the rewrite
                    pending += _seq(expression.parameters())
                    continue
            elif kind not in EXPRESSIONS:
                raise QueryRefused(
                    f"the query calls {_simple(kind)} ({kind}), which is not on runstate sql's allow list "
                    f"of Spark's built-in functions and expressions; nothing was run"
                )
            if self._subquery.isInstance(expression):
                plans.append(expression.plan())
            pending += _seq(expression.children())
        return plans


@functools.cache
def builtin_functions(spark: Any) -> frozenset[str]:
    """The classes of Spark's built-in functions as shipped, less REFUSED_BUILTINS (read once: some 900
    calls into the JVM)."""
    registry = spark.sparkContext._jvm.org.apache.spark.sql.catalyst.analysis.FunctionRegistry.builtin()
    classes = set()
    for name in _seq(registry.listFunction()):
        info = registry.lookupFunction(name)
        if info.isDefined():
            classes.add(str(info.get().getClassName()))
    return frozenset(classes - REFUSED_BUILTINS)


def first_line(error: BaseException) -> str:
    """The first line of Spark's message: not the plan an analysis error prints after it, nor the JVM
    stack trace (a failed job's error comes from the JVM as it is: `Py4JJavaError`)."""
    from runstate.cli import one_line

    text = str(getattr(error, "java_exception", error)).strip()
    return one_line(text.splitlines()[0] if text else "")[:1000]


def _load(spark: Any, name: str) -> Any:
    jvm = spark.sparkContext._jvm
    loader = spark._jsparkSession.getClass().getClassLoader()
    return jvm.java.lang.Class.forName(name, False, loader)


def _simple(kind: str) -> str:
    return kind.rsplit(".", 1)[-1].rstrip("$")


def _words(kind: str) -> str:
    """InsertIntoStatement -> INSERT INTO, DropTable -> DROP TABLE: what the statement says."""
    words = re.findall(r"[A-Z][a-z]*", kind)
    while len(words) > 1 and words[-1] in ("Statement", "Command"):
        words.pop()
    return " ".join(words).upper()


def _seq(scala_seq: Any) -> list[Any]:
    return [scala_seq.apply(i) for i in range(scala_seq.size())]


def _plan_nodes(plan: Any) -> list[Any]:
    """The node and every node under it: children and inner children (a WITH's definitions)."""
    found, pending = [], [plan]
    while pending:
        node = pending.pop()
        found.append(node)
        pending += _seq(node.children()) + _seq(node.innerChildren())
    return found
