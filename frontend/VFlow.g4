// VFlow.g4: the grammar of the .vflow language (see docs/language.md).
//
// The parse tree is turned into the AST by Parser.cpp's ASTBuilder; every
// semantic rule (names, axes, stages, params) lives in the checker
// (Sema*.cpp, listed in SemaImpl.h), not here. Operator precedence, loosest
// first: or, and, not, comparisons, + -, * /, unary -.
grammar VFlow;

file : flowDecl* EOF ;

flowDecl : FLOW name=ID LBRACE flowItem* RBRACE ;

flowItem
  : PARAM name=ID (COLON ty=ID)? ASSIGN expr SEMI                         #paramDecl
  | AXIS name=ID ASSIGN expr SEMI                                         #axisDecl
  | CONST name=ID ASSIGN expr SEMI                                        #constDecl
  | CACHE name=ID (COLON ty=ID)? ASSIGN expr SEMI                         #cacheFieldDecl
  | CACHE LBRACE cacheStmt* RBRACE                                        #cacheBlockDecl
  | STATE name=ID (LBRACK idList? RBRACK)? (COLON ty=ID)? ASSIGN expr SEMI #stateDecl
  | INDEX LBRACE indexStmt* RBRACE                                        #indexDecl
  | RETAIN LPAREN (arg (COMMA arg)*)? RPAREN LBRACE indexStmt* RBRACE     #retainDecl
  ;

cacheStmt
  : LET name=ID ASSIGN expr SEMI                  #cacheLet
  | name=ID (COLON ty=ID)? ASSIGN expr SEMI       #cacheField
  ;

indexStmt
  : LET name=ID ASSIGN expr SEMI                  #indexLet
  | name=ID ASSIGN expr SEMI                      #indexAssign
  | RETURN expr SEMI                              #indexReturn
  ;

idList : ID (COMMA ID)* ;

expr
  : callee=ID LPAREN (arg (COMMA arg)*)? RPAREN                       #callExpr
  | LPAREN expr RPAREN                                                #parenExpr
  | LBRACK (expr (COMMA expr)*)? RBRACK                               #listExpr
  | NUMBER                                                            #numberExpr
  | STRING                                                            #stringExpr
  | (TRUE | FALSE | INF)                                              #keywordExpr
  | ID                                                                #nameExpr
  | op=MINUS expr                                                     #negExpr
  | lhs=expr op=(STAR | SLASH) rhs=expr                               #mulExpr
  | lhs=expr op=(PLUS | MINUS) rhs=expr                               #addExpr
  | lhs=expr op=(LT | LE | GT | GE | EQ | NE) rhs=expr                #cmpExpr
  | op=NOT expr                                                       #notExpr
  | lhs=expr op=AND rhs=expr                                          #andExpr
  | lhs=expr op=OR rhs=expr                                           #orExpr
  ;

arg
  : from=ID ARROW to=ID                           #renameArg
  | name=ID ASSIGN expr                           #namedArg
  | expr                                          #positionalArg
  ;

FLOW   : 'flow' ;
PARAM  : 'param' ;
AXIS   : 'axis' ;
CONST  : 'const' ;
CACHE  : 'cache' ;
STATE  : 'state' ;
INDEX  : 'index' ;
RETAIN : 'retain' ;
LET    : 'let' ;
RETURN : 'return' ;
AND    : 'and' ;
OR     : 'or' ;
NOT    : 'not' ;
TRUE   : 'true' ;
FALSE  : 'false' ;
INF    : 'inf' ;

ARROW  : '->' ;
LE     : '<=' ;
GE     : '>=' ;
EQ     : '==' ;
NE     : '!=' ;
LT     : '<' ;
GT     : '>' ;
ASSIGN : '=' ;
PLUS   : '+' ;
MINUS  : '-' ;
STAR   : '*' ;
SLASH  : '/' ;
LPAREN : '(' ;
RPAREN : ')' ;
LBRACK : '[' ;
RBRACK : ']' ;
LBRACE : '{' ;
RBRACE : '}' ;
COMMA  : ',' ;
SEMI   : ';' ;
COLON  : ':' ;

NUMBER : DIGIT+ ('.' DIGIT*)? EXPONENT? | '.' DIGIT+ EXPONENT? ;
fragment DIGIT : [0-9] ;
fragment EXPONENT : [eE] [+-]? DIGIT+ ;
STRING : '"' (~["\\\r\n] | '\\' ~[\r\n])* '"' ;
// A string that reaches the end of its line; longest match prefers STRING.
UNTERMINATED_STRING : '"' (~["\\\r\n] | '\\' ~[\r\n])* ;
ID     : [a-zA-Z_] [a-zA-Z_0-9]* ;

LINE_COMMENT  : '//' ~[\r\n]* -> skip ;
BLOCK_COMMENT : '/*' .*? '*/' -> skip ;
WS            : [ \t\r\n\f]+ -> skip ;
// Anything else is one bad character; the lexer error listener reports it.
BAD_CHAR      : . ;
