package e2e

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// TestEveryTestParallelOrSerial reads this package's tests: each calls
// parallel(t) as its first statement, or is in serialTests and calls
// neither parallel(t) nor t.Parallel() (its subtests may), or is a test of
// aloneSubtests, which calls t.Parallel() first and alone(t) in exactly
// the subtests listed; every name in serialTests and aloneSubtests exists.
func TestEveryTestParallelOrSerial(t *testing.T) {
	parallel(t)
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	seen := map[string]bool{}
	for _, f := range files {
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "Test") || fn.Name.Name == "TestMain" {
				continue
			}
			name, at := fn.Name.Name, fset.Position(fn.Pos())
			seen[name] = true
			var first string
			if len(fn.Body.List) > 0 {
				first = callName(fn.Body.List[0])
			}
			// Its own calls, not its subtests' (function literals).
			own := map[string]bool{}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				if s, ok := n.(ast.Stmt); ok {
					own[callName(s)] = true
				}
				_, lit := n.(*ast.FuncLit)
				return !lit
			})
			_, serial := serialTests[name]
			subtests, withAlone := aloneSubtests[name]
			switch {
			case serial && (own["t.Parallel"] || own["parallel"]):
				t.Errorf("%s (%s) is in the serial group but runs in parallel", name, at)
			case withAlone:
				if first != "t.Parallel" {
					t.Errorf("%s (%s) has subtests that run alone: it must call t.Parallel() first, not parallel(t)", name, at)
				}
				got := aloneRuns(fn)
				for sub := range subtests {
					if !got[sub] {
						t.Errorf("%s (%s): subtest %s is in aloneSubtests but does not call alone(t) first", name, at, sub)
					}
				}
				for sub := range got {
					if _, ok := subtests[sub]; !ok {
						t.Errorf("%s (%s): subtest %s calls alone(t) but is not in aloneSubtests", name, at, sub)
					}
				}
			case !serial && first != "parallel":
				t.Errorf("%s (%s) does not call parallel(t) first; if it changes what other tests see, add it to serialTests with why", name, at)
			}
		}
	}
	var unknown []string
	for name := range serialTests {
		if !seen[name] {
			unknown = append(unknown, name)
		}
	}
	for name := range aloneSubtests {
		if !seen[name] {
			unknown = append(unknown, name)
		}
	}
	sort.Strings(unknown)
	if len(unknown) > 0 {
		t.Errorf("serialTests or aloneSubtests name tests that do not exist: %v", unknown)
	}
}

// aloneRuns are the names of fn's subtests, t.Run("name", func(t) {...}),
// whose first statement is alone(t).
func aloneRuns(fn *ast.FuncDecl) map[string]bool {
	out := map[string]bool{}
	ast.Inspect(fn.Body, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) != 2 {
			return true
		}
		if sel, ok := call.Fun.(*ast.SelectorExpr); !ok || sel.Sel.Name != "Run" {
			return true
		}
		lit, ok := call.Args[0].(*ast.BasicLit)
		body, isFunc := call.Args[1].(*ast.FuncLit)
		if !ok || !isFunc || len(body.Body.List) == 0 || callName(body.Body.List[0]) != "alone" {
			return true
		}
		if name, err := strconv.Unquote(lit.Value); err == nil {
			out[name] = true
		}
		return true
	})
	return out
}

// callName names the call s is, with t as its only argument or receiver:
// "t.Parallel" for t.Parallel(), "parallel" for parallel(t); "" otherwise.
func callName(s ast.Stmt) string {
	e, ok := s.(*ast.ExprStmt)
	if !ok {
		return ""
	}
	call, ok := e.X.(*ast.CallExpr)
	if !ok {
		return ""
	}
	isT := func(x ast.Expr) bool { id, ok := x.(*ast.Ident); return ok && id.Name == "t" }
	switch fun := call.Fun.(type) {
	case *ast.SelectorExpr:
		if len(call.Args) == 0 && isT(fun.X) {
			return "t." + fun.Sel.Name
		}
	case *ast.Ident:
		if len(call.Args) == 1 && isT(call.Args[0]) {
			return fun.Name
		}
	}
	return ""
}
