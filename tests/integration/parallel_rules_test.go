package integration

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// serialOnly are the helpers a parallel test may not call: they swap the
// package's control plane for everyone, or change or reconcile
// cluster-wide objects that other tests read.
var serialOnly = map[string]string{
	"useControlPlane":         "swaps the control plane every helper uses",
	"useSnapshotControlPlane": "swaps the control plane every helper uses",
	"useHardenedControlPlane": "swaps the control plane every helper uses",
	"startReconcilers":        "runs cluster-wide reconcilers",
	"applyInstall":            "applies the install's cluster-wide objects",
	"doApplyInstall":          "applies the install's cluster-wide objects",
	"startRoleAggregation":    "runs the cluster-wide role aggregation",
	// These start cluster-wide managers on the shared control plane.
	"startUploadManager":                 "runs cluster-wide controllers",
	"startCronController":                "runs cluster-wide controllers",
	"startDataSourceController":          "runs cluster-wide controllers",
	"startCloneDataVolumeController":     "runs cluster-wide controllers",
	"startCloneDataVolumeControllerWith": "runs cluster-wide controllers",
}

// TestParallelTestsStayInTheirNamespaces reads this package's tests: one
// that calls t.Parallel() first calls none of serialOnly, starts its
// controllers limited to its namespaces (startControllers with namespaces,
// every controller.ManagerOptions with Namespaces), and a serial test does
// not start the controllers shared by parallel ones.
func TestParallelTestsStayInTheirNamespaces(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	parallelTests := 0
	for _, f := range files {
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "Test") || fn.Name.Name == "TestMain" || len(fn.Body.List) == 0 {
				continue
			}
			name, at := fn.Name.Name, fset.Position(fn.Pos())
			parallel := isCall(fn.Body.List[0], "t", "Parallel")
			if parallel {
				parallelTests++
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.CallExpr:
					if parallel && onSharedControlPlane(n) {
						t.Errorf("%s (%s) runs in parallel but builds a manager on the shared control plane itself at %s: use runManager with Namespaces", name, at, fset.Position(n.Pos()))
					}
					id, ok := n.Fun.(*ast.Ident)
					if !ok {
						return true
					}
					if id.Name == "runManager" && parallel && len(n.Args) == 2 {
						if lit, ok := n.Args[1].(*ast.CompositeLit); !ok || !hasField(lit, "Namespaces") {
							t.Errorf("%s (%s) runs in parallel but its runManager at %s is cluster-wide: set Namespaces", name, at, fset.Position(n.Pos()))
						}
					}
					if why, bad := serialOnly[id.Name]; bad && parallel {
						t.Errorf("%s (%s) runs in parallel but calls %s, which %s", name, at, id.Name, why)
					}
					if id.Name == "startControllers" && parallel && len(n.Args) < 2 {
						t.Errorf("%s (%s) runs in parallel but starts cluster-wide controllers: give startControllers its namespaces", name, at)
					}
					if id.Name == "sharedClusterControllers" && !parallel {
						t.Errorf("%s (%s) is serial but starts the controllers shared by the parallel tests", name, at)
					}
				}
				return true
			})
		}
	}
	if parallelTests == 0 {
		t.Error("no test of this package runs in parallel")
	}
}

// isCall is whether s is the statement recv.method().
func isCall(s ast.Stmt, recv, method string) bool {
	e, ok := s.(*ast.ExprStmt)
	if !ok {
		return false
	}
	call, ok := e.X.(*ast.CallExpr)
	if !ok {
		return false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	x, ok := sel.X.(*ast.Ident)
	return ok && x.Name == recv && sel.Sel.Name == method
}

// onSharedControlPlane is whether call is controller.NewManager(cfg, ...)
// or ctrl.NewManager(cfg, ...): a manager that reconciles every namespace
// of the package's shared control plane (cfg), not one of a test's own.
func onSharedControlPlane(call *ast.CallExpr) bool {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != "NewManager" || len(call.Args) == 0 {
		return false
	}
	arg, ok := call.Args[0].(*ast.Ident)
	return ok && arg.Name == "cfg"
}

// hasField is whether the keyed literal lit sets field.
func hasField(lit *ast.CompositeLit, field string) bool {
	for _, e := range lit.Elts {
		if kv, ok := e.(*ast.KeyValueExpr); ok {
			if k, ok := kv.Key.(*ast.Ident); ok && k.Name == field {
				return true
			}
		}
	}
	return false
}
